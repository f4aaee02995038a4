package dev.apportion.kafka;

import dev.apportion.client.Worker;
import java.time.Duration;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Consumes the partitions of a topic that a PartitionSet grants this pod (docs/kafka.md):
 * partition {@code p} is unit {@code "p"}. It never joins a consumer group; it {@code assign()}s
 * exactly the partitions it owns and commits offsets under {@code group.id} only to remember
 * where each partition stands. The Java counterpart of apportion.kafka.PartitionConsumer.
 *
 * <ul>
 *   <li>acquire: resume each partition at its committed offset (the beginning when none);
 *   <li>release: stop handing out its records (the one being handled finishes), commit the offset
 *       after the last one handled, then the worker acknowledges;
 *   <li>revoke (taken without a hand-off, or still held at close): stop at once, commit nothing;
 *   <li>serving lease run out (docs/handoff.md): no record handled and no offset committed for
 *       any partition until the worker has confirmed the table again; the partitions stay
 *       assigned, paused.
 * </ul>
 *
 * <pre>{@code
 * Properties kafka = new Properties();
 * kafka.put("bootstrap.servers", "kafka:9092");
 * kafka.put("group.id", "orders");
 * PartitionConsumer consumer =
 *     PartitionConsumer.fromEnvironment("orders", "orders", kafka, record -> apply(record));
 * consumer.start();
 * consumer.installShutdownHook();      // SIGTERM: partitions hand over, then exit
 * }</pre>
 */
public final class PartitionConsumer implements AutoCloseable {
  /** Ownership changes and commits, one call per partition, for logs and metrics. */
  public interface Listener {
    /** {@code action}: acquire, release, stop (revoked, or a release seen after its own
     * lease ran out: nothing committed), suspend or resume (the serving lease
     * ran out, held again: told once the consuming thread has stopped or is about to go on);
     * {@code offset}: where it starts (acquire, resume), its committed offset (release), where
     * it stopped (stop, suspend); null when unknown. */
    default void ownership(String action, int partition, long epoch, Long token, Long offset) {}

    default void committed(int partition, long epoch, Long token, long offset) {}
  }

  private final PartitionLoop loop;
  private final Worker worker;
  private final Listener listener;
  private final Map<Integer, Long> tokens = new TreeMap<>();
  private final String pod = System.getenv().getOrDefault("POD_NAME", "");

  private PartitionConsumer(
      String topic,
      String setName,
      KafkaConsumer<byte[], byte[]> kafka,
      RecordHandler handler,
      Duration commitInterval,
      Listener listener) {
    this.listener = listener;
    this.loop = new PartitionLoop(kafka, topic, handler, commitInterval, this::onCommit, new Fence());
    this.worker = Worker.fromEnvironment("PartitionSet", setName, new Callbacks());
  }

  /**
   * A consumer for this pod ({@code POD_NAME}, {@code POD_NAMESPACE}) of {@code topic} on
   * PartitionSet {@code setName}; {@code kafka}: consumer properties (bootstrap.servers and
   * group.id at least; auto commit is turned off, keys and values are bytes).
   */
  public static PartitionConsumer fromEnvironment(
      String topic, String setName, Properties kafka, RecordHandler handler) {
    return fromEnvironment(topic, setName, kafka, handler, Duration.ofSeconds(1), new Listener() {});
  }

  /** As above, committing every {@code commitInterval} between hand-offs, telling {@code
   * listener} of every ownership change and commit. */
  public static PartitionConsumer fromEnvironment(
      String topic,
      String setName,
      Properties kafka,
      RecordHandler handler,
      Duration commitInterval,
      Listener listener) {
    Properties props = new Properties();
    props.putAll(kafka);
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    return new PartitionConsumer(
        topic, setName, new KafkaConsumer<>(props), handler, commitInterval, listener);
  }

  public Worker worker() {
    return worker;
  }

  /** Starts consuming, then follows the set; returns once the first table was handled. */
  public void start() {
    loop.start();
    worker.start();
  }

  /** On SIGTERM: the partitions hand over (the worker drains), then the consumer closes. */
  public void installShutdownHook() {
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  worker.drainAndClose();
                  loop.close();
                },
                "apportion-kafka-drain"));
  }

  /** Closes the worker (partitions still held are revoked), then the Kafka consumer. */
  @Override
  public void close() {
    worker.close();
    loop.close();
  }

  private void onCommit(int partition, long offset) {
    Long token;
    synchronized (tokens) {
      token = tokens.get(partition);
    }
    var table = worker.table();
    listener.committed(partition, table == null ? 0 : table.epoch(), token, offset);
  }

  private final class Callbacks implements Worker.Callbacks {
    @Override
    public void onAcquire(Set<String> units, long epoch) throws Exception {
      Map<Integer, String> metadata = new TreeMap<>();
      synchronized (tokens) {
        for (String unit : units) {
          Long token = worker.token(unit);
          tokens.put(Integer.parseInt(unit), token);
          // The unit's fencing token rides along as commit metadata: who wrote an offset.
          metadata.put(Integer.parseInt(unit), "apportion token=" + token);
        }
      }
      await(
          loop.acquire(
              partitions(units),
              metadata,
              starts ->
                  partitions(units)
                      .forEach(
                          partition ->
                              listener.ownership(
                                  "acquire",
                                  partition,
                                  epoch,
                                  tokenOf(partition),
                                  starts.get(partition)))));
    }

    @Override
    public void onRelease(Set<String> units, long epoch) throws Exception {
      stop(units, epoch, true);
    }

    @Override
    public void onRevoke(Set<String> units, long epoch) throws Exception {
      stop(units, epoch, false);
    }

    @Override
    public void onSuspend(Set<String> units, long epoch) {
      // Told by the consuming thread between records, after the one being handled when the
      // lease ran out; not awaited: the worker's lease thread must not wait on a handler.
      note("suspend", units, epoch);
    }

    @Override
    public void onResume(Set<String> units, long epoch) {
      note("resume", units, epoch);
    }

    private void note(String action, Set<String> units, long epoch) {
      Set<Integer> wanted = partitions(units);
      loop.note(
          where ->
              where.forEach(
                  (partition, offset) -> {
                    if (wanted.contains(partition)) {
                      listener.ownership(action, partition, epoch, tokenOf(partition), offset);
                    }
                  }));
    }

    private void stop(Set<String> units, long epoch, boolean commit) throws Exception {
      Map<Integer, Long> ends = Map.of();
      Set<Integer> uncommitted = ConcurrentHashMap.newKeySet();
      try {
        ends = await(loop.release(partitions(units), commit, uncommitted));
      } finally { // released partitions have stopped even when their commit failed
        for (int partition : partitions(units)) {
          boolean committed = commit && !uncommitted.contains(partition);
          listener.ownership(
              committed ? "release" : "stop", partition, epoch, tokenOf(partition), ends.get(partition));
          synchronized (tokens) {
            tokens.remove(partition);
          }
        }
      }
    }
  }

  /** Records only for partitions the worker owns now, commits only for partitions it holds
   * within their lease. */
  private final class Fence implements PartitionLoop.Fence {
    @Override
    public boolean mayHandle(int partition) {
      return worker.owns(Integer.toString(partition));
    }

    @Override
    public boolean mayCommit(int partition) {
      String unit = Integer.toString(partition);
      Long token = worker.token(unit);
      if (token == null || !worker.leaseHolds(unit)) {
        return false;
      }
      // A release's own deadline is forgotten once a newer table gives the partition away
      // (hand-off timed out), and leaseHolds then says what the whole lease says: a release seen
      // late, after a fresh confirmation, would commit over the new owner's offsets. So the
      // newest table must still name this pod its owner (releasing or not) under the same token.
      var table = worker.table();
      var state = table == null ? null : table.units().get(unit);
      return state != null && pod.equals(state.owner()) && state.epoch() == token;
    }
  }

  private Long tokenOf(int partition) {
    synchronized (tokens) {
      return tokens.get(partition);
    }
  }

  private static Set<Integer> partitions(Set<String> units) {
    Set<Integer> found = new TreeSet<>();
    units.forEach(unit -> found.add(Integer.parseInt(unit)));
    return found;
  }

  private static Map<Integer, Long> await(CompletableFuture<Map<Integer, Long>> done)
      throws Exception {
    try {
      return done.get();
    } catch (ExecutionException e) {
      throw e.getCause() instanceof Exception cause ? cause : e;
    }
  }
}
