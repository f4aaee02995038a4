package dev.apportion.client;

/** The PartitionSet or ShardSet a table belongs to; (uid, epoch) versions the table. */
public record SetRef(String kind, String namespace, String name, String uid) {}
