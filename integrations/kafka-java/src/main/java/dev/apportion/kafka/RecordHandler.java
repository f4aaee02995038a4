package dev.apportion.kafka;

import org.apache.kafka.clients.consumer.ConsumerRecord;

/** Processes one record; the next record of its partition waits until this returns. */
@FunctionalInterface
public interface RecordHandler {
  void handle(ConsumerRecord<byte[], byte[]> record) throws Exception;
}
