package dev.apportion.pekko;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Function;
import org.apache.pekko.actor.ActorRef;
import org.apache.pekko.actor.Address;
import org.apache.pekko.actor.ClassicActorSystemProvider;
import org.apache.pekko.cluster.Cluster;
import org.apache.pekko.cluster.Member;
import org.apache.pekko.cluster.sharding.external.ExternalShardAllocationStrategy;
import org.apache.pekko.util.Timeout;
import scala.collection.immutable.IndexedSeq;
import scala.concurrent.Future;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Pekko's {@link ExternalShardAllocationStrategy} (shards go where apportion's table says), but a
 * rebalance never starts a hand-off that a dead shard region would have to acknowledge.
 *
 * <p>The coordinator's hand-off waits for every region, the one giving the shard up included;
 * a region on a crashed node never answers, so such a rebalance lasts the whole {@code
 * handoff-timeout} (60 s by default) while the shard is blocked. Two cases started one:
 *
 * <ul>
 *   <li>The node is unreachable: apportion moved its shards to a sibling (the pod turned
 *       NotReady), Pekko tried to move them off the silent region.
 *   <li>The node came back as a new incarnation at the same address (a container restart in
 *       place) before the coordinator saw the old region terminate: the external strategy
 *       looks regions up by address, the new, empty region hid the old one, and every shard
 *       the table kept on that pod looked misplaced.
 * </ul>
 *
 * <p>So the rebalance sees neither regions on unreachable members nor two regions at one
 * address (their shards count as being at that address). Their shards then move as Pekko moves
 * a terminated region's shards: when the member is removed, they are allocated anew, to where
 * the table says.
 */
public final class ApportionAllocationStrategy extends ExternalShardAllocationStrategy {
  private final Cluster cluster;

  public ApportionAllocationStrategy(
      ClassicActorSystemProvider system, String typeName, Timeout timeout) {
    super(system, typeName, timeout);
    this.cluster = Cluster.get(system.classicSystem());
  }

  @Override
  public Future<scala.collection.immutable.Set<String>> rebalance(
      scala.collection.immutable.Map<ActorRef, IndexedSeq<String>> currentShardAllocations,
      scala.collection.immutable.Set<String> rebalanceInProgress) {
    Set<Address> unreachable = new java.util.HashSet<>();
    for (Member member : cluster.state().getUnreachable()) {
      unreachable.add(member.address());
    }
    Map<ActorRef, List<String>> current = new LinkedHashMap<>();
    CollectionConverters.asJava(currentShardAllocations)
        .forEach((region, shards) -> current.put(region, CollectionConverters.asJava(shards)));
    Map<ActorRef, List<String>> seen =
        rebalanceable(current, region -> region.path().address(), unreachable);
    Map<ActorRef, IndexedSeq<String>> converted = new LinkedHashMap<>();
    seen.forEach(
        (region, shards) ->
            converted.put(
                region,
                scala.collection.immutable.Vector$.MODULE$.from(
                    CollectionConverters.asScala(shards))));
    return super.rebalance(
        scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(converted)),
        rebalanceInProgress);
  }

  /**
   * What a rebalance may see of {@code current} (region → shards): regions at an unreachable
   * address left out, and the regions sharing an address merged into the first of them. A
   * local region's address has no host; it is never unreachable and never shared.
   */
  static <R> Map<R, List<String>> rebalanceable(
      Map<R, List<String>> current, Function<R, Address> address, Set<Address> unreachable) {
    Map<Address, R> first = new LinkedHashMap<>();
    Map<R, List<String>> seen = new LinkedHashMap<>();
    current.forEach(
        (region, shards) -> {
          Address at = address.apply(region);
          if (unreachable.contains(at)) {
            return;
          }
          R kept = first.computeIfAbsent(at, a -> region);
          seen.computeIfAbsent(kept, r -> new ArrayList<>()).addAll(shards);
        });
    return seen;
  }
}
