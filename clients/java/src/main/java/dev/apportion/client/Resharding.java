package dev.apportion.client;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * The local state to split or merge in place when the unit count changes (docs/resharding.md).
 *
 * @param carried new unit → the old units (of {@code fromCount}) whose in-memory state it takes
 *     over
 * @param load new unit → old units whose state is not here and must be loaded as on acquire (a
 *     merge sibling this process did not hold)
 */
public record Resharding(
    int fromCount, int toCount, Map<String, List<String>> carried, Map<String, List<String>> load) {
  public Resharding {
    carried = Map.copyOf(carried);
    load = Map.copyOf(load);
  }

  public boolean split() {
    return toCount > fromCount;
  }

  /** parent → the children this process serves from now on (a split). */
  public Map<UnitRange, List<UnitRange>> splits() {
    Map<UnitRange, List<UnitRange>> result = new LinkedHashMap<>();
    TreeMap<String, List<String>> ordered = new TreeMap<>(Units.ORDER);
    ordered.putAll(carried);
    ordered.forEach(
        (child, parents) ->
            result
                .computeIfAbsent(UnitRange.of(parents.get(0), fromCount), p -> new ArrayList<>())
                .add(UnitRange.of(child, toCount)));
    return result;
  }

  /** A merged unit, the siblings held here and the siblings to load. */
  public record Merge(UnitRange merged, List<UnitRange> held, List<UnitRange> missing) {}

  /** One entry per merged unit this process serves from now on (a merge). */
  public List<Merge> merges() {
    List<Merge> result = new ArrayList<>();
    TreeMap<String, List<String>> ordered = new TreeMap<>(Units.ORDER);
    ordered.putAll(carried);
    ordered.forEach(
        (unit, held) ->
            result.add(
                new Merge(
                    UnitRange.of(unit, toCount),
                    held.stream().map(u -> UnitRange.of(u, fromCount)).toList(),
                    load.getOrDefault(unit, List.of()).stream()
                        .map(u -> UnitRange.of(u, fromCount))
                        .toList())));
    return result;
  }
}
