package dev.apportion.pekko;

import dev.apportion.client.AssignmentTable;
import dev.apportion.client.UnitRange;
import dev.apportion.client.UnitState;
import dev.apportion.client.Worker;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import org.apache.pekko.actor.AbstractExtensionId;
import org.apache.pekko.actor.ActorSystem;
import org.apache.pekko.actor.ExtendedActorSystem;
import org.apache.pekko.actor.Extension;
import org.apache.pekko.coordination.lease.LeaseException;

/**
 * The shard leases of one entity type on this node, answered from its apportion {@link Worker}
 * ({@link ApportionLease}, docs/pekko.md). A lease is held while the worker serves the shard, or
 * finishes it during a hand-off within the shard's own serving lease; it is lost (the callback
 * Pekko passed to acquire) as soon as neither is true any more: the serving lease ran out, the
 * table took the shard away, or its release ended.
 */
final class ShardLeases implements AutoCloseable {
  /** How often the leases are checked besides the worker's callbacks: a releasing shard's own
   * deadline comes with no callback. */
  static final Duration TICK = Duration.ofMillis(100);

  /** Where a shard stands for this node. */
  enum Standing {
    /** The worker owns it under a serving lease that holds: entities may run. */
    SERVING,
    /** Being released from here, within its own lease: Pekko's hand-off may finish it. */
    FINISHING,
    /** The fresh table gives it to this pod, the worker has not taken it yet. */
    COMING,
    /** Someone else's, or this node's lease ran out: nothing of it may run here. */
    NONE
  }

  private record Waiting(
      String shard, Consumer<Optional<Throwable>> lost, CompletableFuture<Boolean> result,
      long deadline) {}

  private final String pod;
  private final ScheduledExecutorService ticks;
  private final Map<ApportionLease, Consumer<Optional<Throwable>>> held = new HashMap<>();
  private final Map<ApportionLease, Waiting> waiting = new HashMap<>();
  private volatile Worker worker;

  ShardLeases(String pod, String typeName) {
    this.pod = pod;
    this.ticks =
        Executors.newSingleThreadScheduledExecutor(
            r -> {
              Thread t = new Thread(r, "apportion-pekko-leases-" + typeName);
              t.setDaemon(true);
              return t;
            });
    ticks.scheduleWithFixedDelay(this::check, TICK.toMillis(), TICK.toMillis(), TimeUnit.MILLISECONDS);
  }

  /** The worker to answer from: created after its callbacks, which are {@link #around} ours. */
  void follow(Worker worker) {
    this.worker = worker;
  }

  /**
   * {@code app} with the leases checked first when the serving lease runs out or a shard is
   * revoked, so that Pekko stops the entities at once. Acquisitions and the end of a release
   * show only once the worker settled them, after the callback: the next tick sees them.
   */
  Worker.Callbacks around(Worker.Callbacks app) {
    return new Worker.Callbacks() {
      @Override
      public void onAcquire(Set<String> units, long epoch) throws Exception {
        app.onAcquire(units, epoch);
      }

      @Override
      public void onRelease(Set<String> units, long epoch) throws Exception {
        app.onRelease(units, epoch);
      }

      @Override
      public void onRevoke(Set<String> units, long epoch) throws Exception {
        check();
        app.onRevoke(units, epoch);
      }

      @Override
      public void onSplit(UnitRange parent, List<UnitRange> children, long epoch)
          throws Exception {
        app.onSplit(parent, children, epoch);
      }

      @Override
      public void onMerge(UnitRange merged, List<UnitRange> held, List<UnitRange> missing,
          long epoch) throws Exception {
        app.onMerge(merged, held, missing, epoch);
      }

      @Override
      public void onSuspend(Set<String> units, long epoch) throws Exception {
        check();
        app.onSuspend(units, epoch);
      }

      @Override
      public void onResume(Set<String> units, long epoch) throws Exception {
        app.onResume(units, epoch);
      }
    };
  }

  Standing standing(String shard) {
    Worker w = worker;
    if (w == null) {
      return Standing.NONE;
    }
    if (w.owns(shard)) {
      return Standing.SERVING;
    }
    AssignmentTable table = w.table();
    UnitState unit = table == null ? null : table.units().get(shard);
    if (unit == null) {
      return Standing.NONE;
    }
    boolean mine = pod.equals(unit.owner());
    if (unit.releasing() != null && mine && Objects.equals(w.token(shard), unit.epoch())
        && w.leaseHolds(shard)) {
      return Standing.FINISHING;
    }
    String coming = unit.releasing() != null ? unit.releasing().to() : unit.owner();
    return w.serving() && pod.equals(coming) ? Standing.COMING : Standing.NONE;
  }

  /** Whether the lease of {@code shard} holds now: its entities may run here. */
  boolean holds(String shard) {
    Standing s = standing(shard);
    return s == Standing.SERVING || s == Standing.FINISHING;
  }

  /**
   * True once the worker serves the shard; while the table brings it here, that is waited for
   * up to {@code timeout}, then false (Pekko tries again after its lease-retry-interval). False
   * at once when it is not coming, and then {@code lost} is called: a shard actor waiting for a
   * lease stashes the coordinator's HandOff, so it must stop for the shard to move to its owner.
   */
  CompletionStage<Boolean> acquire(
      ApportionLease lease, Consumer<Optional<Throwable>> lost, Duration timeout) {
    CompletableFuture<Boolean> result = new CompletableFuture<>();
    synchronized (this) {
      Waiting before = waiting.put(lease, new Waiting(lease.shard(), lost, result,
          System.nanoTime() + timeout.toNanos()));
      if (before != null) {
        before.result().complete(false);
      }
    }
    check();
    return result;
  }

  synchronized void release(ApportionLease lease) {
    held.remove(lease);
    Waiting w = waiting.remove(lease);
    if (w != null) {
      w.result().complete(false);
    }
  }

  /** Answers the acquisitions that can be answered, and calls the lost callback of every held
   * lease that no longer holds. */
  void check() {
    List<Runnable> after = new ArrayList<>();
    synchronized (this) {
      long now = System.nanoTime();
      waiting.entrySet().removeIf(e -> {
        Waiting w = e.getValue();
        Standing s = standing(w.shard());
        if (s == Standing.SERVING) {
          held.put(e.getKey(), w.lost());
          after.add(() -> w.result().complete(true));
          return true;
        }
        if (s == Standing.COMING && now - w.deadline() < 0) {
          return false;
        }
        after.add(() -> w.result().complete(false));
        if (s != Standing.COMING) {
          after.add(() -> w.lost().accept(Optional.of(new LeaseException(
              "shard " + w.shard() + " is not this pod's (" + pod + ") in the assignment table,"
                  + " or its serving lease ran out"))));
        }
        return true;
      });
      held.entrySet().removeIf(e -> {
        if (holds(e.getKey().shard())) {
          return false;
        }
        Consumer<Optional<Throwable>> lost = e.getValue();
        String shard = e.getKey().shard();
        after.add(() -> lost.accept(Optional.of(new LeaseException(
            "apportion's serving lease of shard " + shard + " ran out, or the shard left " + pod))));
        return true;
      });
    }
    after.forEach(Runnable::run);
  }

  @Override
  public void close() {
    ticks.shutdownNow();
  }

  /** This actor system's ShardLeases by entity type name, for the leases Pekko creates. */
  static final class Registry implements Extension {
    private static final Id ID = new Id();
    private final Map<String, ShardLeases> byType = new ConcurrentHashMap<>();

    static Registry of(ActorSystem system) {
      return ID.get(system);
    }

    void put(String typeName, ShardLeases leases) {
      byType.put(typeName, leases);
    }

    void remove(String typeName, ShardLeases leases) {
      byType.remove(typeName, leases);
    }

    ShardLeases get(String typeName) {
      return byType.get(typeName);
    }

    private static final class Id extends AbstractExtensionId<Registry> {
      @Override
      public Registry createExtension(ExtendedActorSystem system) {
        return new Registry();
      }
    }
  }
}
