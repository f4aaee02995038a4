"""Kafka consumers whose partitions a PartitionSet places (docs/kafka.md): `PartitionConsumer`
assigns exactly the partitions the set grants this pod, resumes each at its committed offset,
and commits before acknowledging a release. Sits on `apportion.worker`; needs the `kafka` extra
(aiokafka)."""

from apportion.kafka._consumer import ConsumerListener, PartitionConsumer, RecordHandler

__all__ = ["ConsumerListener", "PartitionConsumer", "RecordHandler"]
