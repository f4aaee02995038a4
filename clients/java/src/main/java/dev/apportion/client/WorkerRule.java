package dev.apportion.client;

import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * The worker rule of docs/handoff.md, pure: the Java twin of plan_worker, make_ack and
 * supersedes in apportion.engine.handoff.
 */
public final class WorkerRule {
  private WorkerRule() {}

  /** What a worker must do with a table: acquire afresh, release (then ack), stop at once. */
  public record Plan(Set<String> acquire, Set<String> release, Set<String> stop) {
    public Plan {
      acquire = Set.copyOf(acquire);
      release = Set.copyOf(release);
      stop = Set.copyOf(stop);
    }
  }

  private static boolean isMe(AssignmentTable table, Incarnation me) {
    return me.uid().equals(table.memberUid(me.name()));
  }

  /** Units {@code me} may take new work for: owner is this very pod incarnation, no release. */
  public static Set<String> ownedUnits(AssignmentTable table, Incarnation me) {
    return units(table, me, false);
  }

  /** Units {@code me} still nominally owns but must release and acknowledge. */
  public static Set<String> releasingUnits(AssignmentTable table, Incarnation me) {
    return units(table, me, true);
  }

  private static Set<String> units(AssignmentTable table, Incarnation me, boolean releasing) {
    Set<String> result = new HashSet<>();
    if (!isMe(table, me)) {
      return result;
    }
    table
        .units()
        .forEach(
            (unit, state) -> {
              if (me.name().equals(state.owner()) && (state.releasing() != null) == releasing) {
                result.add(unit);
              }
            });
    return result;
  }

  public static boolean isOwner(AssignmentTable table, Incarnation me, String unit) {
    UnitState state = table.units().get(unit);
    return state != null
        && me.name().equals(state.owner())
        && state.releasing() == null
        && isMe(table, me);
  }

  /**
   * The rule. {@code serving}: unit → fencing token for every unit this process serves now,
   * including ones it is finishing for a release. Serve a unit only while the table says it is
   * yours under the token you acquired it with.
   */
  public static Plan plan(AssignmentTable table, Incarnation me, Map<String, Long> serving) {
    Set<String> kept = new HashSet<>();
    serving.forEach(
        (unit, token) -> {
          UnitState state = table.units().get(unit);
          if (state != null && state.epoch() == token) {
            kept.add(unit);
          }
        });
    Set<String> owned = ownedUnits(table, me);
    Set<String> releasing = releasingUnits(table, me);
    Set<String> acquire = new HashSet<>(owned);
    acquire.removeAll(kept);
    Set<String> release = new HashSet<>(releasing);
    release.retainAll(kept);
    Set<String> stay = new HashSet<>(owned);
    stay.addAll(releasing);
    stay.retainAll(kept);
    Set<String> stop = new HashSet<>(serving.keySet());
    stop.removeAll(stay);
    return new Plan(acquire, release, stop);
  }

  /** The ack to write after handling {@code table}: every unit it marks releasing from {@code
   * me} is released except {@code pending} (units still finishing). */
  public static Ack makeAck(
      AssignmentTable table, Incarnation me, Set<String> pending, boolean draining) {
    Set<String> still = new HashSet<>(pending);
    still.retainAll(releasingUnits(table, me));
    return new Ack(me.uid(), table.epoch(), still, draining);
  }

  /** Whether to act on {@code next} after {@code last}: epochs only move forward within one set
   * incarnation; a recreated set (new uid) starts over. */
  public static boolean supersedes(AssignmentTable next, AssignmentTable last) {
    return last == null || !next.set().uid().equals(last.set().uid()) || next.epoch() > last.epoch();
  }
}
