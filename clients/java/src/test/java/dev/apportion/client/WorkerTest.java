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
import io.fabric8.kubernetes.client.http.HttpClient;
import io.fabric8.kubernetes.client.http.HttpResponse;
import io.fabric8.kubernetes.client.server.mock.EnableKubernetesMockClient;
import io.fabric8.kubernetes.client.server.mock.KubernetesMockServer;
import io.fabric8.mockwebserver.http.RecordedRequest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The Worker against fabric8's in-memory API server. A release is acknowledged only once
 * onRelease returned, with release callbacks that throw, always throw or hang (the Java twin of
 * tests/unit/test_worker_release.py). The serving lease: a worker cut off from the API server, or
 * paused, serves nothing until it confirmed the table again, and releases nothing because of it
 * (the twin of tests/unit/test_worker_lease.py). The real API server runs
 * tests/e2e/test_java_worker.py.
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
  KubernetesMockServer server;
  private String uid;
  /** The servingLease of the tables published, or none. */
  private Double lease;
  /** What the worker's clock adds to the monotonic clock: a paused process sees it jump. */
  private volatile double jumped;
  private int rootGets;
  private boolean published;
  private Worker worker;
  private Watch watch;
  /** Every ack written on the Pod, in order. */
  private final List<Ack> acks = new CopyOnWriteArrayList<>();

  /** Records every call (the lease's too); onRelease throws its first {@code failures} calls (all when negative)
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

    @Override
    public void onSuspend(Set<String> units, long epoch) {
      calls.add("suspend " + new java.util.TreeSet<>(units));
    }

    @Override
    public void onResume(Set<String> units, long epoch) {
      calls.add("resume " + new java.util.TreeSet<>(units));
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
    if (lease != null) {
      doc.put("servingLease", lease);
    }
    doc.set("units", JSON.valueToTree(units));
    doc.set("unitEpochs", JSON.valueToTree(tokens));
    ObjectNode moves = doc.putObject("releasing");
    for (String unit : releasing) {
      moves.putObject(unit).put("from", "w-0").put("to", "w-1").put("since", 100.0)
          .put("epoch", since);
    }
    if (!published) {
      ConfigMap cm = new ConfigMapBuilder().withNewMetadata().withName(ROOT).withNamespace(NS)
          .endMetadata().withData(Map.of("assignments.json", doc.toString())).build();
      client.configMaps().inNamespace(NS).resource(cm).create();
      published = true;
      return;
    }
    // A bare merge patch: the client's update and patch GET the root first, which cutOff() holds.
    ObjectNode patch = JSON.createObjectNode();
    patch.putObject("data").put("assignments.json", doc.toString());
    HttpClient http = client.getHttpClient();
    try {
      HttpResponse<String> answer = http.sendAsync(http.newHttpRequestBuilder()
              .uri(client.getMasterUrl() + "api/v1/namespaces/" + NS + "/configmaps/" + ROOT)
              .patch("application/merge-patch+json", patch.toString()).build(), String.class)
          .get(10, TimeUnit.SECONDS);
      assertEquals(2, answer.code() / 100, answer.body()); // the mock answers 202
    } catch (Exception e) {
      throw new AssertionError(e);
    }
  }

  private Worker start(Recorder callbacks) {
    publish(1, Map.of("0", "w-0", "1", "w-0"), Map.of("0", 1L, "1", 1L), Set.of(), 0);
    worker = new Worker(client, false, "PartitionSet", "orders", NS, "w-0", callbacks,
        Duration.ofMillis(10), () -> ServingLease.MONOTONIC.getAsDouble() + jumped);
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

  /** Every GET of the root answers only after a minute, as behind an iptables DROP: the
   * worker's confirmations time out (the watch, already open, stays quiet). */
  private void cutOff() {
    server.expect().get().delay(1, TimeUnit.MINUTES)
        .withPath("/api/v1/namespaces/" + NS + "/configmaps/" + ROOT)
        .andReturn(200, client.configMaps().inNamespace(NS).withName(ROOT).get()).always();
  }

  /** GETs of the root the server has answered or is holding since the last call. */
  private int rootGets() throws InterruptedException {
    for (RecordedRequest r; (r = server.takeRequest(1, TimeUnit.MILLISECONDS)) != null; ) {
      if (r.getMethod().equals("GET") && r.getPath().endsWith("/configmaps/" + ROOT)) {
        rootGets++;
      }
    }
    int got = rootGets;
    rootGets = 0;
    return got;
  }

  @Test
  void aCutOffWorkerStopsServingAndResumesAfterAFreshConfirmation() throws Exception {
    lease = 0.4; // confirmations every 0.1 s
    Recorder callbacks = new Recorder(0, false);
    start(callbacks);
    assertTrue(worker.serving() && worker.owns("0"));
    assertEquals(1L, worker.token("0"));
    Thread.sleep(300);
    assertTrue(rootGets() >= 3, "confirming every quarter lease");
    int acked = acks.size();
    cutOff();
    await(() -> !worker.serving());
    assertFalse(worker.owns("0"));
    assertEquals(Set.of(), worker.myUnits());
    assertFalse(worker.leaseHolds("0"));
    assertEquals(1L, worker.token("0")); // held, not served
    assertEquals(0, worker.servingTimeLeft());
    await(() -> callbacks.calls.contains("suspend [0, 1]"));
    assertEquals(1, worker.leaseExpiries());
    server.clearExpectations();
    await(() -> worker.serving());
    assertTrue(worker.owns("0") && worker.owns("1"));
    await(() -> callbacks.calls.contains("resume [0, 1]"));
    assertEquals(List.of("acquire [0, 1]", "suspend [0, 1]", "resume [0, 1]"), callbacks.calls);
    // One ack, for the operator's report: the same epoch, nothing released or pending.
    await(() -> acks.size() == acked + 1);
    Ack told = acks.get(acked);
    assertEquals(Set.of(), told.pending());
    assertEquals(1, told.epoch());
    assertEquals(1, told.suspended().count());
    assertEquals(1, worker.leaseExpiries());
  }

  @Test
  void aPausedWorkerServesNothingBeforeItHasConfirmedAgain() {
    lease = 0.4;
    start(new Recorder(0, false));
    cutOff(); // the confirmation after the pause cannot get through yet
    jumped += 4; // as after a SIGSTOP of ten leases
    assertFalse(worker.owns("0")); // the very next check refuses, before the lease thread runs
    assertFalse(worker.serving());
    // What happened meanwhile: the watch brings it, yet a table that arrives is no confirmation.
    publish(2, Map.of("0", "w-1", "1", "w-0"), Map.of("0", 2L, "1", 1L), Set.of(), 0);
    await(() -> worker.table().epoch() == 2);
    assertFalse(worker.owns("1"));
    server.clearExpectations();
    await(() -> worker.serving());
    assertFalse(worker.owns("0"));
    assertTrue(worker.owns("1"));
  }

  @Test
  void aReleaseIsFinishedOnlyUntilTheLeaseBeforeItEnds() {
    // Long enough that unit 1's lease cannot run out on the real clock between the await and the
    // check below on a loaded machine (0.4 s did once); the test ends it with the fake clock.
    lease = 3.0;
    Recorder callbacks = new Recorder(0, true); // the release is in flight until the end
    start(callbacks);
    releasing();
    await(() -> callbacks.count("release") == 1);
    // Unit 1's deadline stops where the release found it, while confirmations extend the
    // worker's: a margin between the two that only grows. (Comparing with a time left read
    // before the release raced a confirmation landing in between.)
    await(() -> worker.servingTimeLeft() > worker.servingTimeLeft("1") + 0.05);
    assertTrue(worker.leaseHolds("1"));
    jumped += worker.servingTimeLeft("1") + 0.001;
    assertFalse(worker.leaseHolds("1")); // its time is up, while unit 0 is still served
    assertEquals(1L, worker.token("1")); // still held: the release has not finished
    assertTrue(worker.owns("0"));
    callbacks.hang.countDown();
  }

  @Test
  void withoutALeaseACutOffWorkerKeepsServingAndConfirmsNothing() throws Exception {
    start(new Recorder(0, false));
    cutOff();
    rootGets();
    jumped += 1000;
    Thread.sleep(300);
    assertTrue(worker.serving() && worker.owns("0"));
    assertEquals(Double.POSITIVE_INFINITY, worker.servingTimeLeft());
    assertEquals(0, rootGets()); // KeepServing: no load on the API server
  }
}
