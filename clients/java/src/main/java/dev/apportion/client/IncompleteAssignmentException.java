package dev.apportion.client;

/** Chunks are missing or do not match their index: the read raced a write; read the root again. */
public final class IncompleteAssignmentException extends AssignmentFormatException {
  private static final long serialVersionUID = 1L;

  public IncompleteAssignmentException(String message) {
    super(message);
  }
}
