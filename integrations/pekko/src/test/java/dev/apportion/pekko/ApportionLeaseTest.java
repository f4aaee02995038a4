package dev.apportion.pekko;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import dev.apportion.client.Names;
import dev.apportion.client.Worker;
import io.fabric8.kubernetes.api.model.ConfigMap;
import io.fabric8.kubernetes.api.model.ConfigMapBuilder;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.http.HttpClient;
import io.fabric8.kubernetes.client.http.HttpResponse;
import io.fabric8.kubernetes.client.server.mock.EnableKubernetesMockClient;
import io.fabric8.kubernetes.client.server.mock.KubernetesMockServer;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.coordination.lease.LeaseSettings;
import org.apache.pekko.coordination.lease.javadsl.Lease;
import org.apache.pekko.coordination.lease.javadsl.LeaseProvider;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The shard lease against a real apportion Worker following fabric8's in-memory API server: pod
 * w-0 owns shards 0 and 1, w-1 owns 2. Acquired only for a shard the worker serves (waiting for
 * one the table hands over), lost when the serving lease runs out, the shard is revoked or its
 * release ends.
 */
@EnableKubernetesMockClient(crud = true)
class ApportionLeaseTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String NS = "ns";
  private static final String ROOT = Names.assignmentConfigMap("ShardSet", "counters");
  private static final Logger MOCK_LOG = Logger.getLogger("io.fabric8.mockwebserver");

  static {
    MOCK_LOG.setLevel(Level.WARNING);
  }

  KubernetesClient client;
  KubernetesMockServer server;
  private String uid;
  private boolean published;
  private Double servingLease;
  private Worker worker;
  private ShardLeases leases;
  /** The worker's own callbacks, as ApportionSharding's would run. */
  private final List<String> calls = new CopyOnWriteArrayList<>();

  /** One shard's lease and what Pekko's shard would have been told. */
  private final class Shard {
    final Lease lease;
    final List<Optional<Throwable>> lost = new CopyOnWriteArrayList<>();

    Shard(String id, Duration timeout) {
      LeaseSettings settings = settings("Counters-shard-counters-" + id);
      lease = new ApportionLease(
          settings.withTimeoutSettings(settings.timeoutSettings().withOperationTimeout(timeout)),
          "Counters", type -> type.equals("counters") ? leases : null);
    }

    Shard(String id) {
      this(id, Duration.ofSeconds(5));
    }

    boolean acquire() throws Exception {
      return lease.acquire(lost::add).toCompletableFuture().get(10, TimeUnit.SECONDS);
    }
  }

  /** The settings LeaseProvider builds from the shipped config (reference.conf). */
  private static LeaseSettings settings(String name) {
    Config config = ConfigFactory.load();
    return LeaseSettings.apply(
        config.getConfig("dev.apportion.pekko.shard-lease")
            .withFallback(config.getConfig("pekko.coordination.lease")),
        name, "127.0.0.1:2551");
  }

  @BeforeEach
  void pod() {
    uid = client.pods().inNamespace(NS).resource(new PodBuilder()
        .withNewMetadata().withName("w-0").withNamespace(NS).withUid("uid-0").endMetadata()
        .withNewSpec().withTerminationGracePeriodSeconds(30L).endSpec()
        .build()).create().getMetadata().getUid();
  }

  @AfterEach
  void close() {
    if (worker != null) {
      worker.close();
    }
    if (leases != null) {
      leases.close();
    }
  }

  /** units: shard → owner; {@code releasing}: shard → the pod it goes to, from its owner. */
  private void publish(long epoch, Map<String, String> units, Map<String, Long> tokens,
      Map<String, String> releasing) {
    ObjectNode doc = JSON.createObjectNode();
    doc.put("apiVersion", "apportion.dev/v1alpha1").put("kind", "Assignment");
    doc.putObject("set").put("kind", "ShardSet").put("namespace", NS).put("name", "counters")
        .put("uid", "set-1");
    doc.put("generation", 1).put("keyScheme", "akka").put("count", 4)
        .put("ackAnnotation", Names.ackAnnotation("ShardSet", "counters")).put("epoch", epoch);
    doc.putArray("members").add(JSON.createObjectNode().put("name", "w-0").put("uid", uid))
        .add(JSON.createObjectNode().put("name", "w-1").put("uid", "uid-1"));
    doc.put("layout", "map");
    if (servingLease != null) {
      doc.put("servingLease", servingLease);
    }
    doc.set("units", JSON.valueToTree(units));
    doc.set("unitEpochs", JSON.valueToTree(tokens));
    ObjectNode moves = doc.putObject("releasing");
    releasing.forEach((unit, to) -> moves.putObject(unit).put("from", units.get(unit))
        .put("to", to).put("since", 100.0).put("epoch", epoch));
    if (!published) {
      ConfigMap cm = new ConfigMapBuilder().withNewMetadata().withName(ROOT).withNamespace(NS)
          .endMetadata().withData(Map.of("assignments.json", doc.toString())).build();
      client.configMaps().inNamespace(NS).resource(cm).create();
      published = true;
      return;
    }
    // A bare merge patch, as WorkerTest's: the mock's watch sees it.
    ObjectNode patch = JSON.createObjectNode();
    patch.putObject("data").put("assignments.json", doc.toString());
    HttpClient http = client.getHttpClient();
    try {
      HttpResponse<String> answer = http.sendAsync(http.newHttpRequestBuilder()
              .uri(client.getMasterUrl() + "api/v1/namespaces/" + NS + "/configmaps/" + ROOT)
              .patch("application/merge-patch+json", patch.toString()).build(), String.class)
          .get(10, TimeUnit.SECONDS);
      assertEquals(2, answer.code() / 100, answer.body());
    } catch (Exception e) {
      throw new AssertionError(e);
    }
  }

  private void start() {
    publish(1, Map.of("0", "w-0", "1", "w-0", "2", "w-1"), Map.of("0", 1L, "1", 1L, "2", 1L),
        Map.of());
    leases = new ShardLeases("w-0", "counters");
    worker = new Worker(client, "ShardSet", "counters", NS, "w-0", leases.around(
        new Worker.Callbacks() {
          @Override
          public void onRelease(Set<String> units, long epoch) {
            calls.add("release " + units);
          }

          @Override
          public void onSuspend(Set<String> units, long epoch) {
            calls.add("suspend " + units);
          }
        }));
    leases.follow(worker);
    worker.start();
    await(() -> worker.myUnits().equals(Set.of("0", "1")));
  }

  private static void await(BooleanSupplier condition) {
    long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
    while (!condition.getAsBoolean()) {
      assertTrue(System.nanoTime() < deadline, "timed out");
      try {
        Thread.sleep(10);
      } catch (InterruptedException e) {
        throw new AssertionError(e);
      }
    }
  }

  @Test
  void pekkoLoadsItFromTheShippedConfigAndItNamesTheShard() throws Exception {
    ActorSystem<Void> system = ActorSystem.create(Behaviors.empty(), "Counters",
        ConfigFactory.parseString("pekko.jvm-shutdown-hooks = off").withFallback(ConfigFactory.load()));
    try {
      Lease lease = LeaseProvider.get(system.classicSystem())
          .getLease("Counters-shard-my-counters-7", "dev.apportion.pekko.shard-lease", "owner");
      assertInstanceOf(ApportionLease.class, lease);
      assertEquals("7", ((ApportionLease) lease).shard());
      // No ApportionSharding started for the type on this node: refused, with why.
      CompletableFuture<Boolean> acquired = lease.acquire().toCompletableFuture();
      assertTrue(acquired.isCompletedExceptionally());
      assertFalse(lease.checkLease());
    } finally {
      system.terminate();
      system.getWhenTerminated().toCompletableFuture().get();
    }
  }

  @Test
  void acquiredForAShardTheWorkerServesAndRefusedAndStoppedForAnotherPods() throws Exception {
    start();
    Shard mine = new Shard("0");
    assertTrue(mine.acquire());
    assertTrue(mine.lease.checkLease());
    Shard theirs = new Shard("2");
    assertFalse(theirs.acquire());
    assertFalse(theirs.lease.checkLease());
    // Told to stop, so that the shard actor does not sit waiting with the coordinator's HandOff.
    await(() -> theirs.lost.size() == 1);
    Thread.sleep(3 * ShardLeases.TICK.toMillis());
    assertEquals(List.of(), mine.lost);
  }

  @Test
  void aShardOnItsWayHereIsAcquiredOnceTheWorkerServesIt() throws Exception {
    start();
    publish(2, Map.of("0", "w-0", "1", "w-0", "2", "w-1"), Map.of("0", 1L, "1", 1L, "2", 1L),
        Map.of("2", "w-0"));
    await(() -> worker.table().epoch() == 2);
    Shard coming = new Shard("2");
    CompletableFuture<Boolean> acquired =
        coming.lease.acquire(coming.lost::add).toCompletableFuture();
    Thread.sleep(3 * ShardLeases.TICK.toMillis());
    assertFalse(acquired.isDone()); // w-1 has not acknowledged yet
    publish(3, Map.of("0", "w-0", "1", "w-0", "2", "w-0"), Map.of("0", 1L, "1", 1L, "2", 3L),
        Map.of());
    assertTrue(acquired.get(10, TimeUnit.SECONDS));
    assertTrue(coming.lease.checkLease());
    assertEquals(List.of(), coming.lost);
  }

  @Test
  void aShardThatDoesNotArriveWithinTheTimeoutIsRefusedButNotStopped() throws Exception {
    start();
    publish(2, Map.of("0", "w-0", "1", "w-0", "2", "w-1"), Map.of("0", 1L, "1", 1L, "2", 1L),
        Map.of("2", "w-0"));
    await(() -> worker.table().epoch() == 2);
    Shard coming = new Shard("2", Duration.ofMillis(300));
    assertFalse(coming.acquire());
    Thread.sleep(3 * ShardLeases.TICK.toMillis());
    assertEquals(List.of(), coming.lost); // sharding asks again after lease-retry-interval
  }

  @Test
  void lostWhenTheServingLeaseRunsOut() throws Exception {
    servingLease = 0.4; // confirmations every 0.1 s
    start();
    Shard mine = new Shard("0");
    assertTrue(mine.acquire());
    // Every GET of the root answers only after a minute, as behind an iptables DROP.
    server.expect().get().delay(1, TimeUnit.MINUTES)
        .withPath("/api/v1/namespaces/" + NS + "/configmaps/" + ROOT)
        .andReturn(200, client.configMaps().inNamespace(NS).withName(ROOT).get()).always();
    await(() -> mine.lost.size() == 1);
    assertFalse(mine.lease.checkLease());
    // The worker suspends too (whichever of its lease thread and our check saw the end first).
    await(() -> calls.stream().anyMatch(c -> c.startsWith("suspend ")));
    assertFalse(new Shard("1").acquire()); // nothing starts here while cut off
  }

  @Test
  void lostWhenItsReleaseEndsAndNotBefore() throws Exception {
    start();
    Shard mine = new Shard("1");
    assertTrue(mine.acquire());
    Shard other = new Shard("0");
    assertTrue(other.acquire());
    publish(2, Map.of("0", "w-0", "1", "w-0", "2", "w-1"), Map.of("0", 1L, "1", 1L, "2", 1L),
        Map.of("1", "w-1"));
    await(() -> calls.contains("release [1]"));
    await(() -> mine.lost.size() == 1);
    assertFalse(mine.lease.checkLease());
    assertEquals(List.of(), other.lost);
    assertTrue(other.lease.checkLease());
  }

  @Test
  void lostWhenTheShardIsRevoked() throws Exception {
    start();
    Shard mine = new Shard("1");
    assertTrue(mine.acquire());
    // handoffTimeout: the operator gave shard 1 to w-1 under a new token.
    publish(2, Map.of("0", "w-0", "1", "w-1", "2", "w-1"), Map.of("0", 1L, "1", 2L, "2", 1L),
        Map.of());
    await(() -> mine.lost.size() == 1);
    assertFalse(mine.lease.checkLease());
  }
}
