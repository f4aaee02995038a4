package dev.apportion.client;

import java.util.Collection;
import java.util.HashMap;
import java.util.Map;
import java.util.function.DoubleSupplier;

/**
 * The serving lease: a worker serves only while its view of the table is confirmed recent
 * (docs/handoff.md, "Cut off or paused: the serving lease"). Pure and not thread-safe: the
 * {@link Worker} guards it with its lock; the clock is passed in. The twin of the Python
 * apportion.worker._lease.ServingLease.
 *
 * <p>A confirmation counts from when the confirming request was <em>sent</em>, not when its
 * answer arrived: however long the answer took, the table it showed was current at or after that
 * instant. A unit the table releases from this worker may be finished only until its own
 * deadline: the last confirmation <em>before</em> the table that released it, plus the lease.
 * Confirming a table that asks for the release does not extend it, since the operator started
 * counting its timeout when that table was published.
 *
 * <p>Times are seconds on the lease's clock; +∞ means never (no lease: {@code whenCutOff:
 * KeepServing}), −∞ already run out (a lease never confirmed yet).
 */
public final class ServingLease {
  /** Confirmations a worker sends per lease: one lost or slow confirmation costs nothing. */
  public static final int RENEWALS_PER_LEASE = 4;

  /**
   * The default clock: {@code System.nanoTime()} in seconds, which on Linux is CLOCK_MONOTONIC.
   * It never steps and counts through GC pauses, SIGSTOP and frozen cgroups, but not through a
   * suspension the kernel itself performs; docs/java-client.md says why that is accepted.
   */
  public static final DoubleSupplier MONOTONIC = () -> System.nanoTime() / 1e9;

  private final DoubleSupplier clock;
  private double duration = Double.POSITIVE_INFINITY;
  private double confirmedAt = Double.NEGATIVE_INFINITY;
  private Map<String, Double> releaseDeadlines = Map.of();

  public ServingLease(DoubleSupplier clock) {
    this.clock = clock;
  }

  /** Seconds now on this lease's clock. */
  public double now() {
    return clock.getAsDouble();
  }

  /** The newest table's lease in seconds; null: no lease (KeepServing). */
  public void duration(Double seconds) {
    duration = seconds == null ? Double.POSITIVE_INFINITY : seconds;
  }

  /** Whether the table carries a lease at all (without one, nothing needs confirming). */
  public boolean bounded() {
    return duration < Double.POSITIVE_INFINITY;
  }

  /** Whether any confirmation arrived yet (before it, an expired lease means starting). */
  public boolean everConfirmed() {
    return confirmedAt > Double.NEGATIVE_INFINITY;
  }

  /** Send time of the newest request whose answer showed the current table (−∞: none yet). */
  public double confirmedAt() {
    return confirmedAt;
  }

  /** A request sent at {@code sentAt} (this lease's clock) showed the table now held. */
  public void confirm(double sentAt) {
    confirmedAt = Math.max(confirmedAt, sentAt);
  }

  /**
   * The newest table releases {@code units} from this worker (and no others): call it before
   * confirming that table, so that their deadlines count from the confirmation before it. A
   * unit already releasing keeps its deadline.
   */
  public void releasing(Collection<String> units) {
    // −∞ + ∞ (never confirmed, no lease) is NaN; a unit released then has no bound of its own.
    double fresh = bounded() ? confirmedAt + duration : Double.POSITIVE_INFINITY;
    Map<String, Double> deadlines = new HashMap<>();
    for (String unit : units) {
      deadlines.put(unit, releaseDeadlines.getOrDefault(unit, fresh));
    }
    releaseDeadlines = deadlines;
  }

  /** When serving anything must stop without a new confirmation. */
  public double expiresAt() {
    return bounded() ? confirmedAt + duration : Double.POSITIVE_INFINITY;
  }

  /** When serving {@code unit} must stop without a new confirmation: its release deadline, if
   * it is releasing, comes first; without a lease, never. */
  public double expiresAt(String unit) {
    double deadline = expiresAt();
    return bounded() ? Math.min(deadline, releaseDeadlines.getOrDefault(unit, deadline)) : deadline;
  }

  /** Whether this worker may serve now. */
  public boolean valid() {
    return now() < expiresAt();
  }

  /** Whether this worker may serve {@code unit} now. */
  public boolean valid(String unit) {
    return now() < expiresAt(unit);
  }

  /** Seconds of serving left: 0 once run out, +∞ without a lease. */
  public double remaining() {
    return Math.max(0, expiresAt() - now());
  }

  /** Seconds of serving {@code unit} left: 0 once run out, +∞ without a lease. */
  public double remaining(String unit) {
    return Math.max(0, expiresAt(unit) - now());
  }

  /** Seconds between confirmations; +∞: no need (KeepServing). */
  public double renewInterval() {
    return duration / RENEWALS_PER_LEASE;
  }
}
