package dev.apportion.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.fabric8.kubernetes.api.model.ConfigMap;
import io.fabric8.kubernetes.api.model.ConfigMapBuilder;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.api.model.PodBuilder;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.Watch;
import io.fabric8.kubernetes.client.Watcher;
import io.fabric8.kubernetes.client.WatcherException;
import io.fabric8.kubernetes.client.server.mock.EnableKubernetesMockClient;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.function.BooleanSupplier;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * A release is acknowledged only once onRelease returned: the Worker against fabric8's in-memory
 * API server, with release callbacks that throw, always throw or hang. The Java twin of
 * tests/unit/test_worker_release.py; the real API server runs tests/e2e/test_java_worker.py.
 */
@EnableKubernetesMockClient(crud = true)
class WorkerTest {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final String NS = "ns";
  private static final String ROOT = Names.assignmentConfigMap("PartitionSet", "orders");
  private static final String ACK = Names.ackAnnotation("PartitionSet", "orders");
  /** fabric8's mock server logs every request at INFO; kept referenced, so the level holds. */
  private static final Logger MOCK_LOG = Logger.getLogger("io.fabric8.mockwebserver");

  static {
    MOCK_LOG.setLevel(Level.WARNING);
  }

  KubernetesClient client;
  private String uid;
  private Worker worker;
  private Watch watch;
  /** Every ack written on the Pod, in order. */
  private final List<Ack> acks = new CopyOnWriteArrayList<>();

  /** Records every call; onRelease throws its first {@code failures} calls (all when negative)
   * or, with {@code hang}, waits until interrupted. */
  static final class Recorder implements Worker.Callbacks {
    final List<String> calls = new CopyOnWriteArrayList<>();
    final int failures;
    final CountDownLatch hang;

    Recorder(int failures, boolean hang) {
      this.failures = failures;
      this.hang = new CountDownLatch(hang ? 1 : 0);
    }

    @Override
    public void onAcquire(Set<String> units, long epoch) {
      calls.add("acquire " + new java.util.TreeSet<>(units));
    }

    @Override
    public void onRelease(Set<String> units, long epoch) throws Exception {
      calls.add("release " + new java.util.TreeSet<>(units));
      hang.await();
      if (failures < 0 || count("release") <= failures) {
        throw new IllegalStateException("storage unavailable");
      }
    }

    @Override
    public void onRevoke(Set<String> units, long epoch) {
      calls.add("revoke " + new java.util.TreeSet<>(units));
    }

    long count(String kind) {
      return calls.stream().filter(c -> c.startsWith(kind + " ")).count();
    }
  }

  @BeforeEach
  void pod() {
    Pod pod =
        client.pods().inNamespace(NS).resource(new PodBuilder()
            .withNewMetadata().withName("w-0").withNamespace(NS).withUid("uid-0").endMetadata()
            .withNewSpec().withTerminationGracePeriodSeconds(30L).endSpec()
            .build()).create();
    uid = pod.getMetadata().getUid();
    watch = client.pods().inNamespace(NS).withName("w-0").watch(new Watcher<>() {
      @Override
      public void eventReceived(Action action, Pod p) {
        Map<String, String> annotations = p.getMetadata().getAnnotations();
        String text = annotations == null ? null : annotations.get(ACK);
        if (text != null) {
          try {
            Ack ack = Ack.fromAnnotation(text);
            if (acks.isEmpty() || !acks.get(acks.size() - 1).equals(ack)) {
              acks.add(ack);
            }
          } catch (AssignmentFormatException e) {
            throw new AssertionError(e);
          }
        }
      }

      @Override
      public void onClose(WatcherException cause) {}
    });
  }

  @AfterEach
  void close() {
    if (worker != null) {
      worker.close();
    }
    watch.close();
  }

  /** units: unit → owner; releasing units go from w-0 to w-1 since {@code since}. */
  private void publish(long epoch, Map<String, String> units, Map<String, Long> tokens,
      Set<String> releasing, long since) {
    ObjectNode doc = JSON.createObjectNode();
    doc.put("apiVersion", "apportion.dev/v1alpha1").put("kind", "Assignment");
    doc.putObject("set").put("kind", "PartitionSet").put("namespace", NS).put("name", "orders")
        .put("uid", "set-1");
    doc.put("generation", 1).put("keyScheme", "netherite").put("count", 4)
        .put("ackAnnotation", ACK).put("epoch", epoch);
    doc.putArray("members").add(JSON.createObjectNode().put("name", "w-0").put("uid", uid))
        .add(JSON.createObjectNode().put("name", "w-1").put("uid", "uid-1"));
    doc.put("layout", "map");
    doc.set("units", JSON.valueToTree(units));
    doc.set("unitEpochs", JSON.valueToTree(tokens));
    ObjectNode moves = doc.putObject("releasing");
    for (String unit : releasing) {
      moves.putObject(unit).put("from", "w-0").put("to", "w-1").put("since", 100.0)
          .put("epoch", since);
    }
    ConfigMap cm = new ConfigMapBuilder().withNewMetadata().withName(ROOT).withNamespace(NS)
        .endMetadata().withData(Map.of("assignments.json", doc.toString())).build();
    client.configMaps().inNamespace(NS).resource(cm).createOr(c -> c.update());
  }

  private Worker start(Recorder callbacks) {
    publish(1, Map.of("0", "w-0", "1", "w-0"), Map.of("0", 1L, "1", 1L), Set.of(), 0);
    worker = new Worker(client, false, "PartitionSet", "orders", NS, "w-0", callbacks,
        Duration.ofMillis(10));
    worker.start();
    await(() -> worker.myUnits().equals(Set.of("0", "1")));
    return worker;
  }

  private void releasing() {
    publish(2, Map.of("0", "w-0", "1", "w-0"), Map.of("0", 1L, "1", 1L), Set.of("1"), 2);
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

  /** Whether {@code ack} reports unit 1's release (published at epoch 2) done. */
  private static boolean released(Ack ack, long lastReleasingEpoch) {
    return ack.epoch() >= 2 && ack.epoch() <= lastReleasingEpoch && !ack.pending().contains("1");
  }

  @Test
  void aReleaseThatThrowsIsRetriedAndAcknowledgedOnlyAfterItSucceeded() {
    Recorder callbacks = new Recorder(3, false);
    start(callbacks);
    releasing();
    await(() -> !acks.isEmpty() && acks.get(acks.size() - 1).equals(new Ack(uid, 2, Set.of(), false)));
    assertEquals(4, callbacks.count("release")); // three failures, then success
    assertEquals(3, worker.releaseFailures());
    assertEquals(Map.of(), worker.failingReleases());
    List<Ack> before = new ArrayList<>(acks.subList(0, acks.size() - 1));
    assertTrue(before.stream().anyMatch(a -> a.failing().equals(
        Map.of("1", "IllegalStateException: storage unavailable"))), before.toString());
    assertTrue(before.stream().noneMatch(a -> released(a, 2)), before.toString());
  }

  @Test
  void aReleaseThatAlwaysThrowsIsNeverAcknowledgedAndStopsWhenRevoked() throws Exception {
    Recorder callbacks = new Recorder(-1, false);
    start(callbacks);
    releasing();
    await(() -> acks.stream().anyMatch(a -> !a.failing().isEmpty()) && callbacks.count("release") >= 4);
    assertEquals(Set.of("1"), worker.failingReleases().keySet());
    assertFalse(worker.owns("1"));
    assertEquals(1L, worker.token("1")); // held, pending: no new work, no ack
    // The operator's handoffTimeout: unit 1 is w-1's under token 3. Retries stop, it is revoked.
    publish(3, Map.of("0", "w-0", "1", "w-1"), Map.of("0", 1L, "1", 3L), Set.of(), 0);
    await(() -> callbacks.calls.contains("revoke [1]"));
    long tries = callbacks.count("release");
    Thread.sleep(200); // many retry periods
    assertEquals(tries, callbacks.count("release"));
    assertEquals(Map.of(), worker.failingReleases());
    assertTrue(acks.stream().noneMatch(a -> released(a, 2)), acks.toString());
  }

  @Test
  void aHangingReleaseIsNeverAcknowledgedNorBlocksOtherUnits() {
    Recorder callbacks = new Recorder(0, true);
    start(callbacks);
    releasing();
    await(() -> callbacks.count("release") == 1);
    // Another unit granted meanwhile is acquired and served while the release hangs.
    publish(3, Map.of("0", "w-0", "1", "w-0", "2", "w-0"), Map.of("0", 1L, "1", 1L, "2", 3L),
        Set.of("1"), 2);
    await(() -> worker.owns("2"));
    assertFalse(worker.owns("1"));
    worker.close(); // interrupts the hung callback after CLOSE_WAIT; acknowledges nothing
    assertTrue(acks.stream().noneMatch(a -> released(a, 3)), acks.toString());
    assertTrue(acks.stream().allMatch(a -> a.failing().isEmpty()), acks.toString());
    assertEquals(0, worker.releaseFailures()); // interrupted by close: not a failure
    assertTrue(callbacks.calls.contains("revoke [0, 1, 2]"), callbacks.calls.toString());
  }
}
