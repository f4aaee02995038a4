package dev.apportion.client;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
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

  /**
   * What a worker does with its in-memory state when a table changes the count it serves.
   *
   * @param carried new unit → the old units whose state it takes over in place
   * @param load new unit → old units to load as an acquire would (merge siblings not held here)
   * @param dropped old units served whose state goes nowhere: stop them
   * @param serving the serving map in the new count's unit names
   */
  public record Reshape(
      Map<String, List<String>> carried,
      Map<String, List<String>> load,
      Set<String> dropped,
      Map<String, Long> serving) {}

  /**
   * The resharding rule (apportion.engine.reshard.reshape), before {@link #plan}, for a table
   * whose count differs from {@code viewCount}, the count of the last table handled; null when
   * it does not. A new unit takes over state only if it is mine (also when a later table marks
   * it releasing from me: the release then hands the state over) still under the token the
   * resharding gave it, and only from parents served under exactly the token they had just
   * before it; anything else is dropped and acquired afresh.
   */
  public static Reshape reshape(
      AssignmentTable table, Incarnation me, int viewCount, Map<String, Long> serving) {
    if (table.count() == viewCount) {
      return null;
    }
    Lineage lineage = table.lineage();
    if (lineage == null || lineage.fromCount() != viewCount) {
      return new Reshape(Map.of(), Map.of(), Set.copyOf(serving.keySet()), Map.of());
    }
    Map<String, List<String>> carried = new HashMap<>();
    Map<String, List<String>> load = new HashMap<>();
    Map<String, Long> next = new HashMap<>();
    Set<String> used = new HashSet<>();
    int factor = Math.max(lineage.fromCount(), lineage.toCount())
        / Math.min(lineage.fromCount(), lineage.toCount());
    boolean split = lineage.toCount() > lineage.fromCount();
    // Releasing from me counts as mine: the state is carried, then handed over by the release.
    Set<String> mineNow = new HashSet<>(ownedUnits(table, me));
    mineNow.addAll(releasingUnits(table, me));
    for (int unit = 0; unit < lineage.toCount(); unit++) {
      String name = Integer.toString(unit);
      if (!mineNow.contains(name) || table.units().get(name).epoch() != lineage.epoch()) {
        continue;
      }
      int first = split ? unit / factor : unit * factor;
      List<String> mine = new ArrayList<>();
      List<String> missing = new ArrayList<>();
      for (int parent = first; parent < first + (split ? 1 : factor); parent++) {
        String p = Integer.toString(parent);
        Long token = serving.get(p);
        (token != null && token.equals(lineage.parentEpochs().get(parent)) ? mine : missing).add(p);
      }
      if (!mine.isEmpty()) {
        carried.put(name, mine);
        used.addAll(mine);
        next.put(name, lineage.epoch());
        if (!missing.isEmpty()) {
          load.put(name, missing);
        }
      }
    }
    Set<String> dropped = new HashSet<>(serving.keySet());
    dropped.removeAll(used);
    return new Reshape(carried, load, dropped, next);
  }

  /** The ack to write after handling {@code table}: every unit it marks releasing from {@code
   * me} is released except {@code pending} (units still finishing); {@code failing}: those of
   * them whose release callback failed and is being retried, with why. */
  public static Ack makeAck(
      AssignmentTable table,
      Incarnation me,
      Set<String> pending,
      boolean draining,
      Map<String, String> failing,
      Ack.Suspensions suspended) {
    Set<String> still = new HashSet<>(pending);
    still.retainAll(releasingUnits(table, me));
    Map<String, String> why = new HashMap<>(failing);
    why.keySet().retainAll(still);
    return new Ack(me.uid(), table.epoch(), still, draining, why, suspended);
  }

  /** Whether to act on {@code next} after {@code last}: epochs only move forward within one set
   * incarnation; a recreated set (new uid) starts over. */
  public static boolean supersedes(AssignmentTable next, AssignmentTable last) {
    return last == null || !next.set().uid().equals(last.set().uid()) || next.epoch() > last.epoch();
  }
}
