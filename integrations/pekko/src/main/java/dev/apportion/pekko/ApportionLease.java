package dev.apportion.pekko;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.function.Consumer;
import java.util.function.Function;
import org.apache.pekko.actor.ExtendedActorSystem;
import org.apache.pekko.coordination.lease.LeaseException;
import org.apache.pekko.coordination.lease.LeaseSettings;
import org.apache.pekko.coordination.lease.javadsl.Lease;

/**
 * A Pekko shard lease held while this node's apportion worker serves the shard (docs/pekko.md):
 * with {@code pekko.cluster.sharding.use-lease = "dev.apportion.pekko.shard-lease"}, a shard starts
 * its entities only once the worker owns it under a serving lease that holds, and Pekko stops
 * the shard and its entities when the lease is lost: apportion's serving lease ran out (this
 * node cut off from the API server, or paused) or the table took the shard away.
 *
 * <p>Sharding names a shard's lease {@code <system>-shard-<typeName>-<shardId>}; the type's
 * {@link ApportionSharding} must be started before the shard asks (before {@code
 * ClusterSharding.init}). {@code lease-operation-timeout} bounds how long {@code acquire} waits
 * for a shard the table is handing to this pod.
 */
public final class ApportionLease extends Lease {
  private final LeaseSettings settings;
  private final String typeName;
  private final String shard;
  private final Function<String, ShardLeases> leases;

  public ApportionLease(LeaseSettings settings, ExtendedActorSystem system) {
    this(settings, system.name(),
        typeName -> ShardLeases.Registry.of(system).get(typeName));
  }

  ApportionLease(LeaseSettings settings, String systemName, Function<String, ShardLeases> leases) {
    this.settings = settings;
    this.leases = leases;
    String prefix = systemName + "-shard-";
    String name = settings.leaseName();
    int dash = name.lastIndexOf('-'); // shard ids are numbers: the type name may have dashes
    if (!name.startsWith(prefix) || dash < prefix.length()) {
      throw new IllegalArgumentException("lease " + name + " is no shard lease of system "
          + systemName + " (<system>-shard-<typeName>-<shardId>): dev.apportion.pekko.shard-lease"
          + " serves pekko.cluster.sharding.use-lease only");
    }
    this.typeName = name.substring(prefix.length(), dash);
    this.shard = name.substring(dash + 1);
  }

  String shard() {
    return shard;
  }

  @Override
  public LeaseSettings getSettings() {
    return settings;
  }

  @Override
  public CompletionStage<Boolean> acquire() {
    return acquire(reason -> {});
  }

  @Override
  public CompletionStage<Boolean> acquire(Consumer<Optional<Throwable>> leaseLostCallback) {
    ShardLeases found = leases.apply(typeName);
    if (found == null) {
      return CompletableFuture.failedFuture(new LeaseException("no ApportionSharding started for"
          + " entity type " + typeName + " on this node: start it before ClusterSharding.init"));
    }
    Duration timeout = settings.timeoutSettings().getOperationTimeout();
    return found.acquire(this, leaseLostCallback, timeout);
  }

  @Override
  public CompletionStage<Boolean> release() {
    ShardLeases found = leases.apply(typeName);
    if (found != null) {
      found.release(this);
    }
    return CompletableFuture.completedFuture(true);
  }

  @Override
  public boolean checkLease() {
    ShardLeases found = leases.apply(typeName);
    return found != null && found.holds(shard);
  }

  @Override
  public String toString() {
    return "ApportionLease(" + typeName + " shard " + shard + ")";
  }
}
