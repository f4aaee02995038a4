package dev.apportion.pekko;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.pekko.actor.Address;
import org.junit.jupiter.api.Test;

/** What a rebalance may see of the coordinator's regions: no dead region's hand-off to wait for. */
class ApportionAllocationStrategyTest {
  private static final Address POD_0 = new Address("pekko", "Shop", "10.0.0.1", 2551);
  private static final Address POD_1 = new Address("pekko", "Shop", "10.0.0.2", 2551);
  private static final Address POD_2 = new Address("pekko", "Shop", "10.0.0.3", 2551);
  /** Regions named "pod#incarnation"; their addresses by pod. */
  private static final Map<String, Address> AT =
      Map.of("pk-0#1", POD_0, "pk-1#1", POD_1, "pk-2#1", POD_2, "pk-2#2", POD_2);

  private static Map<String, List<String>> regions(Object... regionThenShards) {
    Map<String, List<String>> found = new LinkedHashMap<>();
    for (int i = 0; i < regionThenShards.length; i += 2) {
      @SuppressWarnings("unchecked")
      List<String> shards = (List<String>) regionThenShards[i + 1];
      found.put((String) regionThenShards[i], shards);
    }
    return found;
  }

  @Test
  void allReachableAndOneRegionAnAddressIsSeenAsItIs() {
    Map<String, List<String>> current =
        regions("pk-0#1", List.of("0", "1"), "pk-1#1", List.of("2"), "pk-2#1", List.of("3"));
    assertEquals(current, ApportionAllocationStrategy.rebalanceable(current, AT::get, Set.of()));
  }

  /** A node SIGKILLed a moment ago: its region cannot acknowledge a hand-off, so it is not
   * rebalanced from (its shards move once the member is removed). */
  @Test
  void aRegionOnAnUnreachableMemberIsLeftOut() {
    Map<String, List<String>> current =
        regions("pk-0#1", List.of("0"), "pk-1#1", List.of("1"), "pk-2#1", List.of("2", "3"));
    assertEquals(
        regions("pk-0#1", List.of("0"), "pk-1#1", List.of("1")),
        ApportionAllocationStrategy.rebalanceable(current, AT::get, Set.of(POD_2)));
  }

  /** The node restarted in place: the dead incarnation's region still holds its shards, the new
   * one holds none, both at the pod's address. Looked up by address, the empty one made every
   * shard of the pod look misplaced; merged, they are where the table wants them. */
  @Test
  void twoIncarnationsAtOneAddressCountAsOne() {
    Map<String, List<String>> current =
        regions("pk-0#1", List.of("0"), "pk-2#1", List.of("2", "3"), "pk-2#2", List.of());
    assertEquals(
        regions("pk-0#1", List.of("0"), "pk-2#1", List.of("2", "3")),
        ApportionAllocationStrategy.rebalanceable(current, AT::get, Set.of()));
    Map<String, List<String>> later =
        regions("pk-2#2", List.of("4"), "pk-2#1", List.of("2", "3"));
    assertEquals(
        regions("pk-2#2", List.of("4", "2", "3")),
        ApportionAllocationStrategy.rebalanceable(later, AT::get, Set.of()));
  }
}
