package dev.apportion.client;

import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Which member owns each unit, under which epoch (docs/assignment-format.md). Immutable.
 *
 * <p>Checked on construction, as the reference reader checks: member names are unique; every
 * owner and every release target is a member; unit epochs never exceed the table epoch; only
 * owned units are releasing, never to their own owner, with a release epoch between the unit's
 * token and the table epoch.
 *
 * @param units unit → state, in unit order (numbers numerically, then other names)
 * @param lineage null unless the table records a resharding (format version 2)
 * @param servingLease seconds a worker may serve after sending its last confirmation of the
 *     table (docs/handoff.md, the serving lease); null: no lease ({@code whenCutOff:
 *     KeepServing})
 */
public record AssignmentTable(
    SetRef set,
    long generation,
    String keyScheme,
    int count,
    long epoch,
    String ackAnnotation,
    List<Incarnation> members,
    Map<String, UnitState> units,
    Lineage lineage,
    Double servingLease) {

  public AssignmentTable {
    members = List.copyOf(members);
    TreeMap<String, UnitState> ordered = new TreeMap<>(Units.ORDER);
    ordered.putAll(units);
    units = Collections.unmodifiableMap(new LinkedHashMap<>(ordered));
  }

  /** Runs the checks a constructor cannot throw as checked exceptions. */
  static AssignmentTable checked(
      SetRef set,
      long generation,
      String keyScheme,
      int count,
      long epoch,
      String ackAnnotation,
      List<Incarnation> members,
      Map<String, UnitState> units,
      Lineage lineage,
      Double servingLease)
      throws AssignmentFormatException {
    if (servingLease != null && !(servingLease > 0 && servingLease < Double.POSITIVE_INFINITY)) {
      throw new AssignmentFormatException("servingLease: must be a positive number of seconds");
    }
    if (lineage != null && (lineage.toCount() != count || lineage.epoch() > epoch)) {
      throw new AssignmentFormatException("lineage: toCount must be count, epoch at most epoch");
    }
    Map<String, String> uids = new HashMap<>();
    for (Incarnation m : members) {
      if (uids.put(m.name(), m.uid()) != null) {
        throw new AssignmentFormatException("members: duplicate member name " + m.name());
      }
    }
    for (Map.Entry<String, UnitState> entry : units.entrySet()) {
      String unit = entry.getKey();
      UnitState state = entry.getValue();
      if (state.owner() != null && !uids.containsKey(state.owner())) {
        throw new AssignmentFormatException(
            "unit " + unit + ": owner " + state.owner() + " is not a member");
      }
      if (state.epoch() < 0 || state.epoch() > epoch) {
        throw new AssignmentFormatException(
            "unit " + unit + ": epoch " + state.epoch() + " outside 0.." + epoch);
      }
      Release release = state.releasing();
      if (release == null) {
        continue;
      }
      if (state.owner() == null
          || state.owner().equals(release.to())
          || (release.to() != null && !uids.containsKey(release.to()))) {
        throw new AssignmentFormatException(
            "unit " + unit + ": a release needs an owner and another member or null as target");
      }
      if (release.epoch() < state.epoch()
          || release.epoch() > epoch
          || !Double.isFinite(release.since())) {
        throw new AssignmentFormatException("unit " + unit + ": release epoch or time out of range");
      }
    }
    return new AssignmentTable(
        set, generation, keyScheme, count, epoch, ackAnnotation, members, units, lineage,
        servingLease);
  }

  /** The uid the table records for a member name, or null when it is no member. */
  public String memberUid(String name) {
    for (Incarnation m : members) {
      if (m.name().equals(name)) {
        return m.uid();
      }
    }
    return null;
  }

  /** The unit a key belongs to under this table's key scheme and count. */
  public String unitOf(String key) {
    return Integer.toString(KeyScheme.named(keyScheme).unit(key, count));
  }

  /** The nominal owner of a key's unit (a releasing unit still belongs to its owner), or null. */
  public String ownerOf(String key) {
    UnitState state = units.get(unitOf(key));
    return state == null ? null : state.owner();
  }
}
