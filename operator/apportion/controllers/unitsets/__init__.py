"""PartitionSets and ShardSets: the shared placement loop (`loop`) and its handlers."""
