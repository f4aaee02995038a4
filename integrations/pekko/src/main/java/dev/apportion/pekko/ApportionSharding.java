package dev.apportion.pekko;

import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import dev.apportion.client.AssignmentTable;
import dev.apportion.client.UnitState;
import dev.apportion.client.Worker;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.stream.Collectors;
import org.apache.pekko.actor.Address;
import org.apache.pekko.actor.CoordinatedShutdown;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.AskPattern;
import org.apache.pekko.cluster.Member;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.sharding.ShardRegion;
import org.apache.pekko.cluster.sharding.external.ExternalShardAllocation;
import org.apache.pekko.cluster.sharding.external.javadsl.ExternalShardAllocationClient;
import org.apache.pekko.cluster.sharding.typed.ClusterShardingQuery;
import org.apache.pekko.cluster.sharding.typed.GetClusterShardingStats;
import org.apache.pekko.cluster.sharding.typed.GetShardRegionState;
import org.apache.pekko.cluster.sharding.typed.ShardingEnvelope;
import org.apache.pekko.cluster.sharding.typed.ShardingMessageExtractor;
import org.apache.pekko.cluster.sharding.typed.javadsl.ClusterSharding;
import org.apache.pekko.cluster.sharding.typed.javadsl.Entity;
import org.apache.pekko.cluster.sharding.typed.javadsl.EntityTypeKey;
import org.apache.pekko.cluster.typed.Cluster;
import org.apache.pekko.util.Timeout;

/**
 * One Pekko entity type whose shards live where a ShardSet says (docs/pekko.md).
 *
 * <p>apportion's units are the type's shard ids ("0".."n-1") and entities map to them with the
 * {@code akka} key scheme, Pekko's own default extractor. Every node runs an apportion {@link
 * Worker} for its pod and feeds the ShardSet's table into Pekko's external shard allocation
 * ({@link ApportionAllocationStrategy}): the desired node of a shard is the pod a release hands it to,
 * else its owner, translated to a cluster address through the member role {@code pod:<name>}.
 * The coordinator moves shards with its own hand-off (a shard is never hosted twice); a release
 * is acknowledged to apportion only once this node's region confirmed that the shard left it.
 */
public final class ApportionSharding<M> implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(ApportionSharding.class.getName());
  /** Role prefix naming a member's pod. */
  public static final String POD_ROLE = "pod:";
  private static final Duration FEED_EVERY = Duration.ofMillis(250);
  private static final Duration POLL = Duration.ofMillis(200);
  private static final Duration ASK = Duration.ofSeconds(5);

  private final ActorSystem<?> system;
  private final EntityTypeKey<M> typeKey;
  private final int shards;
  private final Worker worker;
  private final ExternalShardAllocationClient locations;
  private final ShardLeases leases;
  private final ScheduledExecutorService feeder;
  private final Map<String, Address> pushed = new HashMap<>();

  private ApportionSharding(
      ActorSystem<?> system, EntityTypeKey<M> typeKey, String shardSet, int shards) {
    this.system = system;
    this.typeKey = typeKey;
    this.shards = shards;
    this.locations = ExternalShardAllocation.get(system).getClient(typeKey.name());
    this.leases = new ShardLeases(System.getenv("POD_NAME"), typeKey.name());
    this.worker = Worker.fromEnvironment("ShardSet", shardSet, leases.around(new Callbacks()));
    leases.follow(worker);
    this.feeder =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "apportion-pekko-feed-" + typeKey.name());
              t.setDaemon(true);
              return t;
            });
  }

  /**
   * The application's config with what this integration needs: the member role {@code
   * pod:$POD_NAME} added to the application's own roles (HOCON lists do not merge, so a plain
   * fallback would drop them and break {@code Entity.withRole}), and no JVM shutdown hooks of
   * Pekko's (Artery's would cut the connections at SIGTERM, CoordinatedShutdown's would leave
   * before the hand-off: ours drains through apportion first, then runs Pekko's coordinated
   * shutdown).
   */
  public static Config podConfig(Config application) {
    String pod = System.getenv("POD_NAME");
    if (pod == null) {
      throw new IllegalStateException("POD_NAME must be set (downward API)");
    }
    return podConfig(application, pod);
  }

  static Config podConfig(Config application, String pod) {
    List<String> roles = new ArrayList<>();
    if (application.hasPath("pekko.cluster.roles")) {
      roles.addAll(application.getStringList("pekko.cluster.roles"));
    }
    roles.add(POD_ROLE + pod);
    return ConfigFactory.parseMap(
            Map.of(
                "pekko.cluster.roles", roles,
                "pekko.jvm-shutdown-hooks", "off",
                "pekko.coordinated-shutdown.run-by-jvm-shutdown-hook", "off"))
        .withFallback(application);
  }

  /**
   * Follows ShardSet {@code shardSet} (this pod's namespace) for {@code typeKey}, whose ShardSet
   * has {@code shards} shards. Returns once the first table (if any) was read.
   */
  public static <M> ApportionSharding<M> start(
      ActorSystem<?> system, EntityTypeKey<M> typeKey, String shardSet, int shards) {
    ApportionSharding<M> sharding = new ApportionSharding<>(system, typeKey, shardSet, shards);
    sharding.worker.start();
    ShardLeases.Registry.of(system.classicSystem()).put(typeKey.name(), sharding.leases);
    sharding.feeder.scheduleWithFixedDelay(
        sharding::feed, 0, FEED_EVERY.toMillis(), TimeUnit.MILLISECONDS);
    return sharding;
  }

  /** {@code entity} with apportion's placement and the {@code akka} key scheme over the set's
   * shard count; pass the result to {@code ClusterSharding.init}. */
  public Entity<M, ShardingEnvelope<M>> entity(Entity<M, ShardingEnvelope<M>> entity) {
    return entity
        .withMessageExtractor(ShardingMessageExtractor.<M>apply(shards))
        .withAllocationStrategy(
            new ApportionAllocationStrategy(system, typeKey.name(), Timeout.create(ASK)));
  }

  /** The apportion worker of this pod (its table, {@code unitOf}, fencing tokens). */
  public Worker worker() {
    return worker;
  }

  /** Pods that are cluster members (Up or WeaklyUp) → their addresses. */
  public Map<String, Address> podAddresses() {
    return podAddresses(Cluster.get(system).state().getMembers());
  }

  /** Of {@code members}, those Up or WeaklyUp with a {@code pod:} role: pod → address. */
  static Map<String, Address> podAddresses(Iterable<Member> members) {
    Map<String, Address> found = new HashMap<>();
    for (Member m : members) {
      if (m.status() != MemberStatus.up() && m.status() != MemberStatus.weaklyUp()) {
        continue;
      }
      for (String role : m.getRoles()) {
        if (role.startsWith(POD_ROLE)) {
          found.put(role.substring(POD_ROLE.length()), m.address());
        }
      }
    }
    return found;
  }

  /** Where each shard should be: the release target while releasing, else the owner (also
   * during a release to nobody, which ends unowned); shards whose pod is not (yet) a member are
   * left to Pekko. */
  static Map<String, String> desiredPods(AssignmentTable table) {
    Map<String, String> pods = new HashMap<>();
    for (Map.Entry<String, UnitState> e : table.units().entrySet()) {
      UnitState s = e.getValue();
      boolean moving = s.releasing() != null && s.releasing().to() != null;
      pods.put(e.getKey(), moving ? s.releasing().to() : s.owner());
    }
    return pods;
  }

  /**
   * Pushes changed desired locations to the allocation strategy's replicated map; nothing while
   * this node's serving lease has run out. Its table may then be stale, and in a last-writer-wins
   * map a stale home written now would beat the fresh ones other nodes wrote before: a shard
   * moved away from a pod could be sent back to it, new allocations included.
   */
  private void feed() {
    try {
      AssignmentTable table = worker.table();
      if (table == null || !worker.serving()) {
        return;
      }
      if (table.count() != shards) {
        LOG.severe("ShardSet has " + table.count() + " shards, the entity type " + shards
            + ": placement not applied");
        return;
      }
      Map<String, Address> addresses = podAddresses();
      Map<String, Address> changed = new HashMap<>();
      synchronized (pushed) {
        desiredPods(table).forEach((shard, pod) -> {
          Address a = addresses.get(pod);
          if (a != null && !a.equals(pushed.get(shard))) {
            changed.put(shard, a);
          }
        });
      }
      if (changed.isEmpty()) {
        return;
      }
      locations.setShardLocations(changed).toCompletableFuture().get(ASK.toMillis(), TimeUnit.MILLISECONDS);
      synchronized (pushed) {
        pushed.putAll(changed);
      }
      LOG.fine("desired locations of " + changed.size() + " shard(s) updated (epoch " + table.epoch() + ")");
    } catch (Exception e) {
      LOG.log(Level.WARNING, "feeding shard locations to Pekko failed; retrying", e);
    }
  }

  /** Shards hosted by this node's region now (GetShardRegionState). */
  public Set<String> localShards() throws Exception {
    return localShards(system, typeKey);
  }

  /** Shards of {@code typeKey} hosted by this node's region now (GetShardRegionState), whoever
   * places them: the sample shows the same for Pekko's own strategy. */
  public static Set<String> localShards(ActorSystem<?> system, EntityTypeKey<?> typeKey)
      throws Exception {
    CompletionStage<ShardRegion.CurrentShardRegionState> state =
        AskPattern.ask(
            ClusterSharding.get(system).shardState(),
            (org.apache.pekko.actor.typed.ActorRef<ShardRegion.CurrentShardRegionState> replyTo) ->
                (ClusterShardingQuery) new GetShardRegionState(typeKey, replyTo),
            ASK,
            system.scheduler());
    return state.toCompletableFuture().get().getShards().stream()
        .map(ShardRegion.ShardState::shardId)
        .collect(Collectors.toSet());
  }

  /** Pekko's view of the whole type (GetClusterShardingStats): pod → shards it hosts. Regions
   * whose member has no pod role are keyed by address. */
  public Map<String, Set<String>> clusterView() throws Exception {
    return clusterView(system, typeKey);
  }

  /** Pekko's view of {@code typeKey} (GetClusterShardingStats) keyed by the members' {@code
   * pod:} roles, whoever places the shards: the sample shows the same for Pekko's own strategy. */
  public static Map<String, Set<String>> clusterView(
      ActorSystem<?> system, EntityTypeKey<?> typeKey) throws Exception {
    CompletionStage<ShardRegion.ClusterShardingStats> stats =
        AskPattern.ask(
            ClusterSharding.get(system).shardState(),
            (org.apache.pekko.actor.typed.ActorRef<ShardRegion.ClusterShardingStats> replyTo) ->
                (ClusterShardingQuery) new GetClusterShardingStats(typeKey, ASK, replyTo),
            ASK.plusSeconds(1),
            system.scheduler());
    Map<Address, String> pods = new HashMap<>();
    podAddresses(Cluster.get(system).state().getMembers())
        .forEach((pod, address) -> pods.put(address, pod));
    Map<String, Set<String>> view = new HashMap<>();
    stats.toCompletableFuture().get().getRegions().forEach((address, region) ->
        view.put(pods.getOrDefault(address, address.toString()), new HashSet<>(region.getStats().keySet())));
    return view;
  }

  /** On SIGTERM: drain through apportion (every shard handed off by the coordinator), then
   * leave the cluster with Pekko's coordinated shutdown. */
  public void installShutdownHook(Duration drainTimeout) {
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      // System.err, not the logger: java.util.logging closes its handlers at JVM shutdown.
      System.err.println("apportion-pekko: SIGTERM, draining " + worker.myUnits());
      worker.drain();
      try {
        if (!worker.awaitDrained(drainTimeout)) {
          LOG.warning("drain timeout over before every shard was handed off");
        }
        System.err.println("apportion-pekko: drained; leaving the cluster");
        close();
        CoordinatedShutdown.get(system).runAll(CoordinatedShutdown.jvmExitReason())
            .toCompletableFuture().get(10, TimeUnit.SECONDS);
      } catch (Exception e) {
        LOG.log(Level.WARNING, "shutdown", e);
      }
    }, "apportion-pekko-drain"));
  }

  @Override
  public void close() {
    feeder.shutdownNow();
    worker.close();
    ShardLeases.Registry.of(system.classicSystem()).remove(typeKey.name(), leases);
    leases.close();
  }

  private final class Callbacks implements Worker.Callbacks {
    /** Logged before the worker serves them: when another node's lease was cut off, this line
     * tells from when the shards were this node's (tests/e2e/test_pekko.py). */
    @Override
    public void onAcquire(Set<String> units, long epoch) {
      LOG.info("shards " + new java.util.TreeSet<>(units) + " acquired (epoch " + epoch + ")");
    }

    /** Acknowledged once the local region confirms that none of {@code units} is hosted here:
     * the coordinator moved them (to the desired location the feed set) or they were never
     * started here. A region that does not answer is no confirmation: this throws, and the
     * Worker keeps the release pending, reports it failing and calls this again. */
    @Override
    public void onRelease(Set<String> units, long epoch) throws Exception {
      feed();
      while (true) {
        Set<String> still;
        try {
          still = new HashSet<>(localShards());
        } catch (ExecutionException e) {
          throw new IllegalStateException(
              "the local region did not say which shards it hosts: " + e.getCause(), e);
        }
        still.retainAll(units);
        if (still.isEmpty()) {
          LOG.info("shards " + units + " left this node (epoch " + epoch + ")");
          return;
        }
        Thread.sleep(POLL.toMillis());
      }
    }

    /** A revoke has no hand-off: the pod is going (or was replaced); Pekko's own leave/down
     * moves the shards. */
    @Override
    public void onRevoke(Set<String> units, long epoch) {}
  }
}
