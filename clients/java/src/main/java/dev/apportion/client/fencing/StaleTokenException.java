package dev.apportion.client.fencing;

/**
 * A write for {@link #unit} under a higher token than {@link #token} was accepted: another
 * owner has the unit now, and nothing of the refused write was committed. The Python twin is
 * apportion.fencing.StaleToken.
 */
public final class StaleTokenException extends Exception {
  private static final long serialVersionUID = 1L;

  private final String unit;
  private final long token;
  private final Long current;

  public StaleTokenException(String unit, long token, Long current) {
    super("unit '" + unit + "': token " + token + " is stale, " + current + " was accepted");
    this.unit = unit;
    this.token = token;
    this.current = current;
  }

  public String unit() {
    return unit;
  }

  public long token() {
    return token;
  }

  /**
   * The highest token accepted, read right after the refusal; null only if someone deleted the
   * unit's row meanwhile (apportion never deletes one).
   */
  public Long current() {
    return current;
  }
}
