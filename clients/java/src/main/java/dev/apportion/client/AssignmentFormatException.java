package dev.apportion.client;

/** The ConfigMaps (or an ack annotation) do not hold a valid assignment document. */
public class AssignmentFormatException extends Exception {
  private static final long serialVersionUID = 1L;

  public AssignmentFormatException(String message) {
    super(message);
  }
}
