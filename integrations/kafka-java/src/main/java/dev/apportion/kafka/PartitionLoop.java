package dev.apportion.kafka;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;

/**
 * The one thread that touches the Kafka {@link Consumer} (it is not thread-safe): applies
 * changes of the partitions consumed between records, fetches, hands records to the handler one
 * at a time, and commits. The Python apportion.kafka._consumer loop, in Java.
 *
 * <p>A release commits the offset after the last record handled and only then completes, so the
 * next owner resumes exactly there; a revoke (no hand-off) stops at once and commits nothing.
 *
 * <p>The {@link Fence} is asked before every record and every commit: a partition the worker
 * may not serve now (its serving lease ran out, or a table took it) is paused, its records
 * stay unhandled and its offset uncommitted until the fence lets it through again.
 */
final class PartitionLoop implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(PartitionLoop.class.getName());
  private static final Duration POLL = Duration.ofMillis(200);

  /** Told where acquired partitions start (partition → offset). */
  @FunctionalInterface
  interface IntakeListener {
    void started(Map<Integer, Long> starts);
  }

  /** Told of every commit: partition, offset. */
  @FunctionalInterface
  interface CommitListener {
    void committed(int partition, long offset);
  }

  /** What the worker allows for a partition now (docs/handoff.md, the serving lease). */
  interface Fence {
    /** Whether to hand out its records: the worker owns it, within the lease. */
    boolean mayHandle(int partition);

    /** Whether to commit its offset: the worker holds it within the lease (a release commits
     * while the partition is no longer owned, until the release's own deadline). */
    boolean mayCommit(int partition);
  }

  /** A change of the partitions consumed; {@code result}: per partition, where it starts
   * (acquire) or its final offset (release: committed; revoke: where it stopped). A release
   * whose commit the fence refused (its own lease ran out) ends like a revoke, where it
   * stopped, and is added to {@code uncommitted}.
   * {@code started} is told where acquired partitions start, on this thread before their first
   * record is handled, so that what it logs comes before any record's line. A {@code note}
   * changes nothing: {@code started} is told where every partition consumed stands. */
  private record Change(
      Set<Integer> acquire,
      Set<Integer> release,
      boolean commit,
      boolean note,
      IntakeListener started,
      Set<Integer> uncommitted,
      CompletableFuture<Map<Integer, Long>> result) {}

  private final Consumer<byte[], byte[]> consumer;
  private final String topic;
  private final RecordHandler handler;
  private final Duration commitInterval;
  private final CommitListener onCommit;
  private final Fence fence;
  private final Map<Integer, String> commitMetadata = new HashMap<>();
  private final BlockingQueue<Change> changes = new LinkedBlockingQueue<>();
  private final Map<Integer, Long> positions = new TreeMap<>();
  private final Map<Integer, Long> committed = new HashMap<>();
  private final Thread thread;
  private volatile boolean stopping;

  PartitionLoop(
      Consumer<byte[], byte[]> consumer,
      String topic,
      RecordHandler handler,
      Duration commitInterval,
      CommitListener onCommit,
      Fence fence) {
    this.consumer = consumer;
    this.topic = topic;
    this.handler = handler;
    this.commitInterval = commitInterval;
    this.onCommit = onCommit;
    this.fence = fence;
    this.thread = new Thread(this::run, "apportion-kafka-" + topic);
  }

  void start() {
    thread.start();
  }

  /** Starts consuming {@code partitions} at their committed offsets (the beginning when none);
   * {@code metadata}: what to commit them with (the unit's fencing token). */
  CompletableFuture<Map<Integer, Long>> acquire(
      Set<Integer> partitions,
      Map<Integer, String> metadata,
      IntakeListener started) {
    synchronized (commitMetadata) {
      commitMetadata.putAll(metadata);
    }
    return submit(
        new Change(
            Set.copyOf(partitions), Set.of(), true, false, started, Set.of(), new CompletableFuture<>()));
  }

  /** Tells {@code told}, on this thread between two records, where every partition consumed
   * stands: after the record being handled now, so that a line it logs comes after that
   * record's. */
  CompletableFuture<Map<Integer, Long>> note(IntakeListener told) {
    return submit(
        new Change(Set.of(), Set.of(), false, true, told, Set.of(), new CompletableFuture<>()));
  }

  /** Stops consuming {@code partitions}, the record being handled finishing first; with
   * {@code commit}, their offsets are committed before this completes, except those the fence
   * refuses: they are added to {@code uncommitted} before it completes. */
  CompletableFuture<Map<Integer, Long>> release(
      Set<Integer> partitions, boolean commit, Set<Integer> uncommitted) {
    return submit(
        new Change(
            Set.of(),
            Set.copyOf(partitions),
            commit,
            false,
            started -> {},
            uncommitted,
            new CompletableFuture<>()));
  }

  private CompletableFuture<Map<Integer, Long>> submit(Change change) {
    if (!thread.isAlive()) {
      change.result().completeExceptionally(new IllegalStateException("the consuming loop is not running"));
      return change.result();
    }
    changes.add(change);
    return change.result();
  }

  private void run() {
    long nextCommit = System.nanoTime() + commitInterval.toNanos();
    try {
      while (!stopping) {
        Change change =
            positions.isEmpty() ? changes.poll(POLL.toMillis(), TimeUnit.MILLISECONDS) : changes.poll();
        while (change != null) {
          apply(change);
          change = changes.poll();
        }
        gate();
        if (!positions.isEmpty() && !handle(consumer.poll(POLL))) {
          // A change is waiting: what was fetched past the last record handled is dropped;
          // seeking makes the consumer fetch it again.
          seekAll();
        }
        if (System.nanoTime() >= nextCommit) {
          try {
            commit(positions.keySet());
          } catch (RuntimeException e) { // the next interval, or the release, tries again
            LOG.warning("committing offsets failed: " + e);
          }
          nextCommit = System.nanoTime() + commitInterval.toNanos();
        }
      }
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } catch (RuntimeException e) {
      LOG.log(Level.SEVERE, "the consuming loop failed", e);
    }
    for (Change left = changes.poll(); left != null; left = changes.poll()) {
      left.result().completeExceptionally(new IllegalStateException("the consuming loop stopped"));
    }
  }

  /** Hands the records over in order; false when stopped early for a waiting change. */
  private boolean handle(ConsumerRecords<byte[], byte[]> batch) throws InterruptedException {
    for (TopicPartition tp : batch.partitions()) {
      for (ConsumerRecord<byte[], byte[]> record : batch.records(tp)) {
        if (!changes.isEmpty()) {
          return false;
        }
        if (!fence.mayHandle(tp.partition())) {
          return false; // the lease ran out mid-batch: gate() pauses the partition
        }
        Long position = positions.get(tp.partition());
        if (position == null || position != record.offset()) {
          break; // fetched for a position since replaced by a seek
        }
        try {
          handler.handle(record);
        } catch (InterruptedException e) {
          throw e;
        } catch (Exception e) {
          // As in the Python loop: the loop stops (acquisitions fail and are retried) rather
          // than skip a record or hand it over twice.
          throw new IllegalStateException("handling " + tp + "@" + record.offset() + " failed", e);
        }
        positions.put(tp.partition(), record.offset() + 1);
      }
    }
    return true;
  }

  private void apply(Change change) {
    if (change.note()) {
      Map<Integer, Long> where = new TreeMap<>(positions);
      change.started().started(where);
      change.result().complete(where);
      return;
    }
    RuntimeException error = null;
    Map<Integer, Long> result = new TreeMap<>();
    Set<Integer> refused = new HashSet<>();
    if (!change.release().isEmpty() && change.commit()) {
      Set<Integer> held = new HashSet<>(change.release());
      held.retainAll(positions.keySet());
      try {
        refused = commit(held);
      } catch (RuntimeException failed) { // stopped all the same: the next owner resumes earlier
        error = failed;
      }
    }
    for (int partition : change.release()) {
      Long position = positions.remove(partition);
      Long last = committed.remove(partition);
      // A release seen after its lease ran out (cut off, paused) commits nothing: its partition
      // is, or is about to be, someone else's, like a revoked one.
      boolean stopped = !change.commit() || refused.contains(partition);
      if (change.commit() && stopped) {
        change.uncommitted().add(partition);
      }
      Long end = stopped ? position : last;
      if (end != null) {
        result.put(partition, end);
      }
    }
    synchronized (commitMetadata) {
      commitMetadata.keySet().removeAll(change.release());
    }
    try {
      Set<Integer> fresh = new HashSet<>(change.acquire());
      fresh.removeAll(positions.keySet());
      Set<Integer> all = new HashSet<>(positions.keySet());
      all.addAll(fresh);
      consumer.assign(partitions(all));
      Map<Integer, Long> starts = resumeOffsets(fresh);
      positions.putAll(starts);
      committed.putAll(starts);
      result.putAll(starts);
      seekAll();
      change.started().started(starts);
    } catch (RuntimeException failed) {
      error = error == null ? failed : error;
    }
    if (error != null) {
      change.result().completeExceptionally(error);
    } else {
      change.result().complete(result);
    }
  }

  /**
   * Pauses the partitions the fence holds back, at the position after the last record handled
   * (dropping what was fetched beyond it), and resumes those it lets through again: a paused
   * partition costs no fetches.
   */
  private void gate() {
    Set<TopicPartition> paused = consumer.paused();
    for (Map.Entry<Integer, Long> entry : positions.entrySet()) {
      TopicPartition tp = new TopicPartition(topic, entry.getKey());
      boolean may = fence.mayHandle(entry.getKey());
      if (!may && !paused.contains(tp)) {
        consumer.pause(List.of(tp));
        consumer.seek(tp, entry.getValue());
      } else if (may && paused.contains(tp)) {
        consumer.resume(List.of(tp));
      }
    }
  }

  private List<TopicPartition> partitions(Set<Integer> numbers) {
    List<TopicPartition> found = new ArrayList<>();
    numbers.stream().sorted().forEach(p -> found.add(new TopicPartition(topic, p)));
    return found;
  }

  private void seekAll() {
    positions.forEach((partition, offset) -> consumer.seek(new TopicPartition(topic, partition), offset));
  }

  /** The committed offset of each partition, its beginning when it has none. */
  private Map<Integer, Long> resumeOffsets(Set<Integer> fresh) {
    Map<Integer, Long> offsets = new TreeMap<>();
    if (fresh.isEmpty()) {
      return offsets;
    }
    Map<TopicPartition, OffsetAndMetadata> found = consumer.committed(new HashSet<>(partitions(fresh)));
    List<TopicPartition> missing = new ArrayList<>();
    for (TopicPartition tp : partitions(fresh)) {
      OffsetAndMetadata at = found.get(tp);
      if (at == null) {
        missing.add(tp);
      } else {
        offsets.put(tp.partition(), at.offset());
      }
    }
    if (!missing.isEmpty()) {
      consumer.beginningOffsets(missing).forEach((tp, offset) -> offsets.put(tp.partition(), offset));
    }
    return offsets;
  }

  /** Commits what was handled of {@code partitions}; those the fence refuses are returned. */
  private Set<Integer> commit(Set<Integer> partitions) {
    Map<TopicPartition, OffsetAndMetadata> due = new HashMap<>();
    Map<Integer, Long> offsets = new TreeMap<>();
    Set<Integer> refused = new HashSet<>();
    for (int partition : partitions) {
      long position = positions.get(partition);
      if (!fence.mayCommit(partition)) {
        refused.add(partition);
      } else if (!Long.valueOf(position).equals(committed.get(partition))) {
        String metadata;
        synchronized (commitMetadata) {
          metadata = commitMetadata.getOrDefault(partition, "");
        }
        due.put(new TopicPartition(topic, partition), new OffsetAndMetadata(position, metadata));
        offsets.put(partition, position);
      }
    }
    if (due.isEmpty()) {
      return refused;
    }
    consumer.commitSync(due);
    offsets.forEach(
        (partition, offset) -> {
          committed.put(partition, offset);
          onCommit.committed(partition, offset);
        });
    return refused;
  }

  /** Stops the loop (pending changes fail) and closes the consumer. */
  @Override
  public void close() {
    stopping = true;
    try {
      thread.join(Duration.ofSeconds(10).toMillis());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
    consumer.close();
  }
}
