package dev.apportion.client;

import java.util.List;

/**
 * How a table's units derive from those of the count before the latest resharding
 * (docs/resharding.md). This client reads it and, like a format version 1 reader, carries no
 * state across a resharding: every unit's token changes, so it stops the old units and acquires
 * the new ones afresh.
 */
public record Lineage(int fromCount, int toCount, long epoch, List<Long> parentEpochs) {
  public Lineage {
    parentEpochs = List.copyOf(parentEpochs);
  }
}
