package dev.apportion.client;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.fabric8.kubernetes.api.model.ConfigMap;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import io.fabric8.kubernetes.client.KubernetesClientException;
import io.fabric8.kubernetes.client.NamespacedKubernetesClient;
import io.fabric8.kubernetes.client.RequestConfig;
import io.fabric8.kubernetes.client.RequestConfigBuilder;
import io.fabric8.kubernetes.client.dsl.base.PatchContext;
import io.fabric8.kubernetes.client.dsl.base.PatchType;
import io.fabric8.kubernetes.client.informers.ResourceEventHandler;
import io.fabric8.kubernetes.client.informers.SharedIndexInformer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.function.DoubleSupplier;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A worker pod's side of one PartitionSet or ShardSet: follows the set's assignment table
 * through the API server, applies the worker rule of docs/handoff.md through {@link Callbacks},
 * and acknowledges releases on its own Pod. The Java counterpart of the Python
 * apportion.worker.Worker (docs/java-client.md).
 *
 * <pre>{@code
 * Worker worker = Worker.fromEnvironment("PartitionSet", "orders", callbacks);
 * worker.start();
 * worker.installShutdownHook();        // SIGTERM: drain through the hand-off, then exit
 * // per request: String unit = worker.unitOf(orderId);
 * //   if (worker.owns(unit)) serve, writing with worker.token(unit) as fencing token
 * }</pre>
 *
 * <p>Threads: the informer's thread decodes tables; one worker thread plans transitions and
 * writes acks; callbacks run on a pool: each transition on a thread of its own (revocations, then
 * a split or merge, then acquisitions), its releases on another. Each unit's callbacks run one at
 * a time, in order (a unit whose callback runs is left out of new transitions); other units'
 * callbacks do not wait for them, so a release that fails or hangs holds back only its own units
 * (and a change of unit count, which waits until no callback runs). Fencing ({@link #owns})
 * follows each table the moment it arrives, before any callback runs.
 *
 * <p>A release is acknowledged only once {@code onRelease} returned. When it throws, the units
 * stay releasing and pending (the ack lists them as {@code failing}, with the exception) and it
 * is called again for the units still to release, after 0.5 s doubling to 10 s, until it returns
 * or the operator takes them away ({@code handoffTimeout}: then {@code onRevoke}).
 *
 * <p>The serving lease (docs/handoff.md, "Cut off or paused"): while the table carries one
 * ({@code whenCutOff: StopServing}), a thread of its own GETs the root ConfigMap every quarter
 * lease, and the worker serves only while the last request that confirmed the table was sent
 * less than a lease ago ({@link ServingLease}); {@link #owns}, {@link #myUnits} and {@link
 * #leaseHolds} follow it. When it runs out (the API server unreachable, or this process paused)
 * {@code onSuspend} is called; after a fresh confirmation, {@code onResume}. Nothing is
 * released, revoked or acknowledged because of it. {@link #servingTimeLeft} tells in advance
 * how long serving may go on without a new confirmation.
 */
public final class Worker implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(Worker.class.getName());
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int INCOMPLETE_ATTEMPTS = 5;
  private static final Duration RETRY = Duration.ofMillis(200);
  private static final Duration ACQUIRE_RETRY = Duration.ofSeconds(1);
  static final Duration RELEASE_RETRY = Duration.ofMillis(500);
  static final Duration RELEASE_RETRY_MAX = Duration.ofSeconds(10);
  /** How long close() lets running callbacks finish before it interrupts them. */
  static final Duration CLOSE_WAIT = Duration.ofSeconds(5);
  private static final Duration DRAIN_MARGIN = Duration.ofSeconds(2);

  /** What the application does when units come and go; {@code epoch} is the table's. */
  public interface Callbacks {
    /** Start serving: load state. Throwing leaves the units unserved until a later table. */
    default void onAcquire(Set<String> units, long epoch) throws Exception {}

    /** Take no new work, finish or hand over what is in flight; the ack follows the return.
     * Throwing: not acknowledged; called again (for the units still to release) after a pause. */
    default void onRelease(Set<String> units, long epoch) throws Exception {}

    /** Taken away without a hand-off (or the worker closes): drop at once. Default: onRelease. */
    default void onRevoke(Set<String> units, long epoch) throws Exception {
      onRelease(units, epoch);
    }

    /**
     * The unit count grew (keyScheme apportion, docs/resharding.md): cut the parent's in-memory
     * state into the children, in place. Not overridden (or throwing): the parents are revoked
     * and the children acquired afresh through onAcquire.
     */
    default void onSplit(UnitRange parent, List<UnitRange> children, long epoch) throws Exception {
      throw new UnsupportedOperationException("no split callback");
    }

    /**
     * The unit count shrank: join the state of the {@code held} siblings into {@code merged},
     * loading the {@code missing} ones as an acquire would. Not overridden (or throwing): as for
     * onSplit.
     */
    default void onMerge(UnitRange merged, List<UnitRange> held, List<UnitRange> missing, long epoch)
        throws Exception {
      throw new UnsupportedOperationException("no merge callback");
    }

    /**
     * The serving lease ran out (the API server unreachable for longer than it, or this process
     * paused): {@code units}, every unit held, are served no more until the table is confirmed
     * again; cancel their in-flight work. Nothing is released. Runs on the lease thread, which
     * confirms nothing until it returns.
     */
    default void onSuspend(Set<String> units, long epoch) throws Exception {}

    /** The table was confirmed again after {@code onSuspend}: {@code units} are what the table,
     * read again, grants this worker now. Runs on the lease thread. */
    default void onResume(Set<String> units, long epoch) throws Exception {}
  }

  private final KubernetesClient client;
  private final boolean ownsClient;
  private final String namespace;
  private final String podName;
  private final String rootName;
  private final String setKind;
  private final String setName;
  private final Callbacks callbacks;
  private final Duration releaseRetry;
  private final Object lock = new Object();
  private final ExecutorService callbackThreads;
  private final ServingLease lease;
  private WorkerState state;
  /** resourceVersion of the root whose table was handled last: a confirmation compares it. */
  private String handledVersion;
  private boolean suspended;
  private double suspendedAt; // on the lease's clock: when the lease ran out
  private long leaseExpiries;
  private long releaseFailures;
  private Duration grace = Duration.ofSeconds(30);
  private SharedIndexInformer<ConfigMap> informer;
  private Thread loop;
  private Thread leaseLoop;
  private volatile boolean closed;
  private boolean fenced;

  public Worker(
      KubernetesClient client,
      String setKind,
      String setName,
      String namespace,
      String podName,
      Callbacks callbacks) {
    this(client, false, setKind, setName, namespace, podName, callbacks, RELEASE_RETRY,
        ServingLease.MONOTONIC);
  }

  /** As above, with the first pause before a failed release is retried and the serving lease's
   * clock (tests). */
  Worker(
      KubernetesClient client,
      boolean ownsClient,
      String setKind,
      String setName,
      String namespace,
      String podName,
      Callbacks callbacks,
      Duration releaseRetry,
      DoubleSupplier clock) {
    this.client = client;
    this.ownsClient = ownsClient;
    this.setKind = setKind;
    this.setName = setName;
    this.namespace = namespace;
    this.podName = podName;
    this.callbacks = callbacks;
    this.releaseRetry = releaseRetry;
    this.lease = new ServingLease(clock);
    this.rootName = Names.assignmentConfigMap(setKind, setName);
    this.callbackThreads =
        Executors.newCachedThreadPool(
            r -> {
              Thread t = new Thread(r, "apportion-callback-" + setName);
              t.setDaemon(true);
              return t;
            });
  }

  /** A worker for this pod ({@code POD_NAME}, {@code POD_NAMESPACE} from the downward API), with
   * a client from in-cluster config or {@code KUBECONFIG}. */
  public static Worker fromEnvironment(String setKind, String setName, Callbacks callbacks) {
    String pod = System.getenv("POD_NAME");
    String namespace = System.getenv("POD_NAMESPACE");
    if (pod == null || namespace == null) {
      throw new IllegalStateException("POD_NAME and POD_NAMESPACE must be set (downward API)");
    }
    KubernetesClient client = new KubernetesClientBuilder().build();
    return new Worker(
        client, true, setKind, setName, namespace, pod, callbacks, RELEASE_RETRY,
        ServingLease.MONOTONIC);
  }

  /**
   * Reads its own Pod (uid, grace period, an ack left by an earlier process of this pod), reads
   * the table (a quorum read, which confirms it for the serving lease), then follows it;
   * returns once the first table was handled.
   */
  public void start() {
    Pod pod = client.pods().inNamespace(namespace).withName(podName).get();
    if (pod == null) {
      throw new IllegalStateException("pod " + namespace + "/" + podName + " does not exist");
    }
    Incarnation me = new Incarnation(podName, pod.getMetadata().getUid());
    Long seconds = pod.getSpec().getTerminationGracePeriodSeconds();
    if (seconds != null) {
      grace = Duration.ofSeconds(seconds);
    }
    synchronized (lock) {
      state = new WorkerState(me, setKind, namespace, setName);
      Map<String, String> annotations = pod.getMetadata().getAnnotations();
      String left = annotations == null ? null : annotations.get(Names.ackAnnotation(setKind, setName));
      if (left != null) {
        try {
          state.ackWritten(Ack.fromAnnotation(left));
        } catch (AssignmentFormatException e) {
          LOG.warning("ignoring the ack annotation on my pod: " + e.getMessage());
        }
      }
    }
    double sent = lease.now();
    ConfigMap root = client.configMaps().inNamespace(namespace).withName(rootName).get();
    if (root != null && handle(client, root)) {
      synchronized (lock) {
        lease.confirm(sent);
      }
    }
    loop = new Thread(this::run, "apportion-worker-" + setName);
    loop.setDaemon(true);
    loop.start();
    leaseLoop = new Thread(this::confirmLoop, "apportion-lease-" + setName);
    leaseLoop.setDaemon(true);
    leaseLoop.start();
    informer =
        client
            .configMaps()
            .inNamespace(namespace)
            .withName(rootName)
            .inform(
                new ResourceEventHandler<>() {
                  @Override
                  public void onAdd(ConfigMap cm) {
                    handle(client, cm);
                  }

                  @Override
                  public void onUpdate(ConfigMap old, ConfigMap cm) {
                    handle(client, cm);
                  }

                  @Override
                  public void onDelete(ConfigMap cm, boolean unknown) {
                    // Garbage collection after the set's deletion, or a mistake: the last table
                    // stands (nobody else is granted its units).
                    LOG.warning("assignment ConfigMap " + rootName + " was deleted");
                  }
                });
  }

  /**
   * Decodes a root ConfigMap (fetching its chunks through {@code api}) and hands the table to the
   * state; whether it did. A root that does not decode (nor stays complete) confirms nothing.
   */
  private boolean handle(KubernetesClient api, ConfigMap root) {
    for (int attempt = 0; attempt < INCOMPLETE_ATTEMPTS && root != null; attempt++) {
      try {
        List<ConfigMapPayload> parts = new ArrayList<>();
        ConfigMapPayload payload = payload(root);
        parts.add(payload);
        for (String suffix : AssignmentCodec.chunkSuffixes(payload)) {
          ConfigMap chunk = api.configMaps().inNamespace(namespace).withName(rootName + suffix).get();
          if (chunk == null) {
            throw new IncompleteAssignmentException("chunk ConfigMap " + rootName + suffix + " is missing");
          }
          parts.add(payload(chunk));
        }
        return receive(AssignmentCodec.decode(parts), root.getMetadata().getResourceVersion());
      } catch (IncompleteAssignmentException e) {
        // A newer root replaced this one (and its chunks) while we read: read it again.
        LOG.fine("assignment " + rootName + " incomplete (" + e.getMessage() + "); reading it again");
        sleep(RETRY.multipliedBy(attempt + 1));
        root = api.configMaps().inNamespace(namespace).withName(rootName).get();
      } catch (AssignmentFormatException e) {
        LOG.severe("ignoring invalid assignment in ConfigMap " + rootName + ": " + e.getMessage());
        return false;
      }
    }
    return false;
  }

  private ConfigMapPayload payload(ConfigMap cm) throws AssignmentFormatException {
    return ConfigMapPayload.of(cm.getMetadata().getName(), rootName, cm.getData(), cm.getBinaryData());
  }

  /** Hands a table, read from the root at {@code version}, to the state; whether it could. */
  private boolean receive(AssignmentTable table, String version) {
    synchronized (lock) {
      try {
        if (state.receive(table)) {
          lease.duration(table.servingLease());
          // Before the table is confirmed: a release's deadline counts from the confirmation
          // before it.
          lease.releasing(WorkerRule.releasingUnits(table, state.me()));
          lock.notifyAll();
        } else if (state.rewound()) {
          LOG.warning("the table went back to epoch " + table.epoch() + ": writing the ack again");
          lock.notifyAll();
        }
      } catch (IllegalArgumentException e) {
        LOG.severe("ignoring assignment in ConfigMap " + rootName + ": " + e.getMessage());
        return false;
      }
      handledVersion = version;
      return true;
    }
  }

  /**
   * The lease thread: confirms the table every quarter lease, and says so when the lease runs
   * out or holds again. Without a lease in the table it waits for one: no requests at all.
   */
  private void confirmLoop() {
    while (!closed) {
      // A paused process learns first that it ran out; a table without a lease resumes it.
      leaseChanged();
      double interval;
      synchronized (lock) {
        try {
          while (!closed && !lease.bounded()) {
            lock.wait(); // receive() notifies when a table sets a lease, close() when closing
          }
        } catch (InterruptedException e) {
          return;
        }
        interval = lease.renewInterval();
      }
      double sent = lease.now();
      if (confirm(interval)) {
        synchronized (lock) {
          lease.confirm(sent);
        }
      }
      leaseChanged();
      double wake = sent + interval;
      double deadline;
      synchronized (lock) {
        deadline = lease.expiresAt();
      }
      double now = lease.now();
      if (deadline > now) {
        wake = Math.min(wake, deadline); // to tell at once when it runs out
      }
      try {
        TimeUnit.NANOSECONDS.sleep((long) Math.ceil(Math.max(0, wake - now) * 1e9));
      } catch (InterruptedException e) {
        return; // close()
      }
    }
  }

  /**
   * GETs the root (a quorum read) within {@code interval} seconds, without retries: whether it
   * holds the table handled last, or a newer one, which is handled first. Gone, undecodable,
   * refused or unanswered in time: no, and the lease runs on towards its end.
   */
  private boolean confirm(double interval) {
    RequestConfig quick =
        new RequestConfigBuilder(client.getConfiguration().getRequestConfig())
            .withRequestTimeout((int) Math.max(1, Math.ceil(interval * 1000)))
            .withRequestRetryBackoffLimit(0)
            .build();
    try {
      return client
          .adapt(NamespacedKubernetesClient.class)
          .withRequestConfig(quick)
          .call(
              api -> {
                ConfigMap root = api.configMaps().inNamespace(namespace).withName(rootName).get();
                if (root == null) {
                  return false;
                }
                synchronized (lock) {
                  if (Objects.equals(root.getMetadata().getResourceVersion(), handledVersion)) {
                    return true;
                  }
                }
                return handle(api, root);
              });
    } catch (RuntimeException e) { // unreachable, slow, refused: the lease runs on
      LOG.fine("confirming the assignment failed: " + e);
      return false;
    }
  }

  /** Calls onSuspend when the lease has run out, onResume when it holds again; one log line
   * each. Before the first confirmation the worker is starting, not cut off. */
  private void leaseChanged() {
    Set<String> units;
    long epoch;
    boolean suspend;
    synchronized (lock) {
      if (!lease.everConfirmed() || lease.valid() != suspended) {
        return;
      }
      suspend = !suspended;
      suspended = suspend;
      epoch = state.epoch();
      if (suspend) {
        suspendedAt = lease.expiresAt();
        leaseExpiries++;
        units = Set.copyOf(state.held().keySet());
        LOG.warning(String.format(
            "serving lease ran out: the assignment was last confirmed %.1fs ago; serving none of"
                + " %d unit(s) until the API server confirms it again",
            lease.now() - lease.confirmedAt(), units.size()));
      } else {
        state.resumed(lease.now() - suspendedAt);
        lock.notifyAll(); // tell the operator now what could not be written meanwhile
        units = Set.copyOf(state.myUnits());
        LOG.info("assignment confirmed again at epoch " + epoch + ": serving " + units.size()
            + " unit(s)");
      }
    }
    if (suspend) {
      call("onSuspend", units, epoch, "serving nothing anyway",
          () -> callbacks.onSuspend(units, epoch));
    } else {
      call("onResume", units, epoch, "serving them anyway",
          () -> callbacks.onResume(units, epoch));
    }
  }

  /** The worker thread: hands each transition to the pool, writes the acks that become due. */
  private void run() {
    while (!closed) {
      WorkerState.Transition t;
      Ack ack = null;
      synchronized (lock) {
        t = state.nextTransition();
        if (t == null) {
          ack = fenced ? null : state.ackDue();
          if (ack == null) {
            lock.notifyAll();
            try {
              lock.wait();
            } catch (InterruptedException e) {
              return;
            }
            continue;
          }
        }
      }
      if (t != null) {
        WorkerState.Transition next = t;
        if (!execute(() -> transition(next))) {
          return; // closing: what it would have done is revoked by close()
        }
      } else {
        writeAck(ack);
      }
    }
  }

  /** Runs {@code work} on the callback pool; false once the worker closes. */
  private boolean execute(Runnable work) {
    try {
      callbackThreads.execute(work);
      return true;
    } catch (RejectedExecutionException e) {
      return false;
    }
  }

  /** A change of state after a callback: the worker thread plans again and writes the ack. */
  private void settle(Runnable change) {
    synchronized (lock) {
      change.run();
      lock.notifyAll();
    }
  }

  private void transition(WorkerState.Transition t) {
    if (!t.stop().isEmpty()) {
      call("onRevoke", t.stop(), t.epoch(), "dropped anyway",
          () -> callbacks.onRevoke(t.stop(), t.epoch()));
      settle(() -> state.stopped(t.stop()));
    }
    if (t.resharding() != null) {
      reshard(t.resharding(), t.epoch());
    }
    // On a thread of its own: a release being retried (or hanging) must not hold back
    // acquisitions. Closing already: the units stay held and close() revokes them.
    if (!t.release().isEmpty()) {
      execute(() -> release(t.release(), t.epoch()));
    }
    if (!t.acquire().isEmpty()) {
      String then = "trying again in " + ACQUIRE_RETRY.toMillis() + " ms";
      boolean ok =
          call("onAcquire", t.acquire(), t.epoch(), then,
                  () -> callbacks.onAcquire(t.acquire(), t.epoch()))
              == null;
      if (!ok) {
        sleep(ACQUIRE_RETRY);
      }
      settle(() -> state.acquired(t.acquire(), ok));
    }
  }

  /**
   * onRelease until it returns, then the units count as released (the ack follows). While it
   * throws, the units stay busy and pending, and are tried again after a pause, as long as the
   * view still names this process their owner and the worker is open.
   */
  private void release(Set<String> units, long epoch) {
    Duration delay = releaseRetry;
    Set<String> left = units;
    while (!left.isEmpty()) {
      Set<String> trying = left;
      String then = "not acknowledged; retrying in " + delay.toMillis() + " ms";
      Exception failed =
          call("onRelease", trying, epoch, then, () -> callbacks.onRelease(trying, epoch));
      if (failed == null) {
        settle(() -> state.released(trying));
        return;
      }
      if (closed) {
        return; // interrupted by close(), which revokes what is still held
      }
      synchronized (lock) {
        releaseFailures++;
        state.releaseFailed(trying, failed.getClass().getSimpleName() + ": " + failed.getMessage());
        lock.notifyAll(); // the ack says which releases fail
        left = retryAfter(trying, delay);
      }
      Duration doubled = delay.multipliedBy(2);
      delay = doubled.compareTo(RELEASE_RETRY_MAX) < 0 ? doubled : RELEASE_RETRY_MAX;
    }
  }

  /**
   * Waits {@code delay} (holding the lock, which waiting releases) before failed releases are
   * tried again; units taken away meanwhile, or all when the worker closes, are given up at once,
   * so that their revoke need not wait. Returns the units to try again.
   */
  private Set<String> retryAfter(Set<String> units, Duration delay) {
    long deadline = System.nanoTime() + delay.toNanos();
    while (true) {
      Set<String> wanted = closed ? Set.of() : state.retryWanted(units);
      if (!wanted.equals(units)) {
        Set<String> gone = new HashSet<>(units);
        gone.removeAll(wanted);
        state.releaseAbandoned(gone);
        lock.notifyAll();
        units = wanted;
      }
      long left = deadline - System.nanoTime();
      if (units.isEmpty() || left <= 0) {
        return units;
      }
      try {
        lock.wait(Math.max(1, left / 1_000_000));
      } catch (InterruptedException e) { // close() interrupts what outlives its wait
        state.releaseAbandoned(units);
        return Set.of();
      }
    }
  }

  private void reshard(Resharding change, long epoch) {
    Set<String> units = change.carried().keySet();
    boolean ok = true;
    try {
      if (change.split()) {
        for (Map.Entry<UnitRange, List<UnitRange>> e : change.splits().entrySet()) {
          callbacks.onSplit(e.getKey(), e.getValue(), epoch);
        }
      } else {
        for (Resharding.Merge m : change.merges()) {
          callbacks.onMerge(m.merged(), m.held(), m.missing(), epoch);
        }
      }
    } catch (UnsupportedOperationException e) {
      ok = false;
      LOG.info("resharding " + change.fromCount() + " -> " + change.toCount() + ": " + e.getMessage()
          + "; acquiring afresh");
    } catch (Exception e) {
      ok = false;
      LOG.log(Level.WARNING, "resharding " + change.fromCount() + " -> " + change.toCount()
          + " failed; acquiring afresh", e);
    }
    if (!ok) {
      // Acquire afresh: the old units' state goes, the new units come through onAcquire.
      Set<String> old = new java.util.TreeSet<>(Units.ORDER);
      change.carried().values().forEach(old::addAll);
      call("onRevoke", old, epoch, "dropped anyway", () -> callbacks.onRevoke(old, epoch));
    }
    boolean done = ok;
    settle(() -> state.resharded(units, done));
  }

  private interface Call {
    void run() throws Exception;
  }

  /** Runs a callback; the exception it threw (logged with {@code then}, what happens next), or
   * null when it returned. */
  private static Exception call(
      String name, Set<String> units, long epoch, String then, Call call) {
    try {
      call.run();
      return null;
    } catch (InterruptedException e) { // close() stops what outlives its wait: not a failure
      Thread.currentThread().interrupt();
      LOG.info(name + "(" + units + ", epoch " + epoch + ") interrupted");
      return e;
    } catch (Exception e) {
      LOG.log(Level.SEVERE, name + "(" + units + ", epoch " + epoch + ") threw; " + then, e);
      return e;
    }
  }

  /**
   * A JSON merge patch of the ack annotation on this very Pod, carrying its uid: a patch from an
   * earlier incarnation of the pod name is then refused (422, uid is immutable).
   */
  private void writeAck(Ack ack) {
    String key;
    String uid;
    synchronized (lock) {
      AssignmentTable view = state.view();
      key = view != null ? view.ackAnnotation() : Names.ackAnnotation(setKind, setName);
      uid = ack.uid();
    }
    ObjectNode patch = JSON.createObjectNode();
    ObjectNode metadata = patch.putObject("metadata");
    metadata.put("uid", uid);
    metadata.putObject("annotations").put(key, ack.toAnnotation());
    try {
      client
          .pods()
          .inNamespace(namespace)
          .withName(podName)
          .patch(PatchContext.of(PatchType.JSON_MERGE), patch.toString());
      synchronized (lock) {
        state.ackWritten(ack);
        lock.notifyAll();
      }
    } catch (KubernetesClientException e) {
      if (e.getCode() == 422 || e.getCode() == 409 || e.getCode() == 404) {
        // This pod incarnation is gone (deleted, or replaced under the same name, whose uid the
        // server refuses to change): its deletion is the fence; it must not ack for its successor.
        LOG.severe("pod " + podName + " uid " + uid + " is gone; no more acks: " + e.getMessage());
        synchronized (lock) {
          fenced = true;
          lock.notifyAll();
        }
      } else {
        LOG.warning("writing the ack failed, retrying: " + e.getMessage());
        sleep(RETRY.multipliedBy(5));
      }
    }
  }

  /** Whether to take new work for {@code unit} now (see {@link WorkerState#owns}), within the
   * serving lease. */
  public boolean owns(String unit) {
    synchronized (lock) {
      return state != null && state.owns(unit) && lease.valid(unit);
    }
  }

  /** The fencing token of a unit this process holds (acquiring, serving or releasing it), or
   * null: pass it to stores that reject writes under older tokens. It stays while the serving
   * lease is out (an acquisition may need it before the first confirmation, and fenced storage
   * refuses it once a newer one wrote): whether to serve is {@link #owns} or {@link #leaseHolds}. */
  public Long token(String unit) {
    synchronized (lock) {
      return state == null ? null : state.token(unit);
    }
  }

  /** Whether the serving lease of {@code unit} still holds (a unit being released has its own,
   * earlier end): work on it, such as finishing a release, may go on. Always true without a
   * lease (KeepServing). */
  public boolean leaseHolds(String unit) {
    synchronized (lock) {
      return lease.valid(unit);
    }
  }

  /** False while the serving lease has run out: nothing is served until it is confirmed again. */
  public boolean serving() {
    synchronized (lock) {
      return lease.valid();
    }
  }

  /** Seconds that serving may go on without a new confirmation: 0 once the lease has run out,
   * infinite without a lease (KeepServing). Bound in-flight work by it. */
  public double servingTimeLeft() {
    synchronized (lock) {
      return lease.remaining();
    }
  }

  /** As {@link #servingTimeLeft()}, for {@code unit}: a unit being released may have less. */
  public double servingTimeLeft(String unit) {
    synchronized (lock) {
      return lease.remaining(unit);
    }
  }

  /** Times the serving lease ran out since the start: export it as the counter {@code
   * apportion_worker_serving_lease_expiries_total} (docs/metrics.md). */
  public long leaseExpiries() {
    synchronized (lock) {
      return leaseExpiries;
    }
  }

  /** onRelease calls that threw since the start (each is retried): export it as the counter
   * {@code apportion_worker_release_failures_total} (docs/metrics.md). */
  public long releaseFailures() {
    synchronized (lock) {
      return releaseFailures;
    }
  }

  /** Unit → why, for every unit whose release is failing and being retried now: its size is
   * the gauge {@code apportion_worker_releases_failing}. */
  public Map<String, String> failingReleases() {
    synchronized (lock) {
      return state == null ? Map.of() : state.failing();
    }
  }

  /** Units this process takes new work for now (none while the serving lease has run out). */
  public Set<String> myUnits() {
    synchronized (lock) {
      return state == null || !lease.valid() ? Set.of() : Set.copyOf(state.myUnits());
    }
  }

  /** The newest table received, or null before the first. */
  public AssignmentTable table() {
    synchronized (lock) {
      return state == null ? null : state.view();
    }
  }

  /** The unit of a key under the newest table's key scheme and count. */
  public String unitOf(String key) {
    AssignmentTable table = table();
    if (table == null) {
      throw new IllegalStateException("no assignment table yet");
    }
    return table.unitOf(key);
  }

  /** Asks the operator to move every unit away (the ack says {@code draining: true}); the units
   * go through the normal hand-off. */
  public void drain() {
    synchronized (lock) {
      state.startDraining();
      lock.notifyAll();
    }
  }

  /** Waits until nothing is held or granted and every release is acknowledged; whether it got
   * there within {@code timeout}. */
  public boolean awaitDrained(Duration timeout) throws InterruptedException {
    long deadline = System.nanoTime() + timeout.toNanos();
    synchronized (lock) {
      while (!(state.drained() || fenced)) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          return false;
        }
        lock.wait(Math.max(1, left / 1_000_000));
      }
      return true;
    }
  }

  /** On SIGTERM (the JVM's shutdown): {@link #drainAndClose}. */
  public void installShutdownHook() {
    Runtime.getRuntime().addShutdownHook(new Thread(this::drainAndClose, "apportion-drain-" + setName));
  }

  /** Drains, waits until drained or the pod's grace period less a margin is over, then closes:
   * what a pod does on SIGTERM. */
  public void drainAndClose() {
    drain();
    try {
      if (!awaitDrained(grace.minus(DRAIN_MARGIN))) {
        LOG.warning("grace period over before every unit was handed off");
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    close();
  }

  /** Stops following the table and acknowledging; failing releases stop being retried, callbacks
   * still running after {@link #CLOSE_WAIT} are interrupted; units still held are revoked,
   * without an ack: the pod's deletion is their fence. */
  @Override
  public void close() {
    if (closed) {
      return;
    }
    closed = true;
    if (informer != null) {
      informer.close();
    }
    synchronized (lock) {
      lock.notifyAll(); // releases waiting to be retried give up now
    }
    for (Thread thread : new Thread[] {loop, leaseLoop}) {
      if (thread != null) {
        thread.interrupt();
        try {
          thread.join(Duration.ofSeconds(5).toMillis());
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
    }
    callbackThreads.shutdown();
    try {
      if (!callbackThreads.awaitTermination(CLOSE_WAIT.toMillis(), TimeUnit.MILLISECONDS)) {
        LOG.warning(
            "closing: interrupting callbacks still running after " + CLOSE_WAIT.toSeconds() + " s");
        callbackThreads.shutdownNow();
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    Set<String> left;
    long epoch;
    synchronized (lock) {
      left = state == null ? Set.of() : state.dropAll();
      epoch = state == null ? 0 : state.epoch();
    }
    if (!left.isEmpty()) {
      call("onRevoke", left, epoch, "dropped anyway", () -> callbacks.onRevoke(left, epoch));
    }
    if (ownsClient) {
      client.close();
    }
  }

  private static void sleep(Duration duration) {
    try {
      Thread.sleep(duration.toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
