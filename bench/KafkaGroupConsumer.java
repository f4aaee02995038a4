import com.sun.net.httpserver.HttpServer;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;

/**
 * bench/kafka_group_consumer.py in Java (the plain KafkaConsumer of kafka-clients, subscribed to
 * a group), so the benchmark's Java row has a group side to stand beside: the same flags and log
 * lines, for the protocols cooperative-sticky, kip848 and static. bench/bench_kafka.py compiles
 * it once against integrations/kafka-java's classpath (which holds kafka-clients); it is not
 * part of anything installed.
 */
public final class KafkaGroupConsumer {
  private static final Set<Integer> held = new TreeSet<>();
  private static String pod;
  private static String set;

  private KafkaGroupConsumer() {}

  private static synchronized void print(String line) {
    Instant now = Instant.now();
    System.out.printf(Locale.ROOT, "%d.%06d %s%n", now.getEpochSecond(), now.getNano() / 1000, line);
    System.out.flush();
  }

  private static synchronized void ownership(String action, Collection<TopicPartition> parts) {
    Set<Integer> sorted = new TreeSet<>();
    parts.forEach(p -> sorted.add(p.partition()));
    for (int p : sorted) {
      boolean acquire = action.equals("acquire");
      // A member told again of what it keeps changes nothing.
      if (acquire == held.contains(p)) {
        continue;
      }
      print(
          String.format(
              "%s unit=%d epoch=0 token=- pod=%s set=%s offset=-1", action, p, pod, set));
      if (acquire) {
        held.add(p);
      } else {
        held.remove(p);
      }
    }
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = new HashMap<>(Map.of("--work-time", "0", "--port", "8080"));
    for (int i = 0; i + 1 < argv.length; i += 2) {
      args.put(argv[i], argv[i + 1]);
    }
    String protocol = args.get("--protocol");
    pod = System.getenv().getOrDefault("POD_NAME", "-");
    set = "Group/" + args.get("--group");
    long workMillis = Math.round(Double.parseDouble(args.get("--work-time")) * 1000);
    Properties kafka = new Properties();
    kafka.put("bootstrap.servers", args.get("--bootstrap"));
    kafka.put("group.id", args.get("--group"));
    kafka.put("auto.offset.reset", "earliest");
    kafka.put("auto.commit.interval.ms", "1000");
    kafka.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
    kafka.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
    if (protocol.equals("kip848")) {
      kafka.put("group.protocol", "consumer"); // the broker assigns; its heartbeat interval
    } else {
      kafka.put(
          "partition.assignment.strategy",
          "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");
      kafka.put("heartbeat.interval.ms", "1000");
      kafka.put("session.timeout.ms", protocol.equals("static") ? "15000" : "10000");
    }
    if (protocol.equals("static")) {
      kafka.put("group.instance.id", pod);
    }
    KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(kafka);
    CountDownLatch closed = new CountDownLatch(1);
    Thread loop = Thread.currentThread();
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  consumer.wakeup();
                  try {
                    closed.await();
                  } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                  }
                }));
    consumer.subscribe(
        List.of(args.get("--topic")),
        new ConsumerRebalanceListener() {
          @Override
          public void onPartitionsRevoked(Collection<TopicPartition> parts) {
            // Auto-commit does not cover a cooperative revocation (666 records of a rolling
            // restart handled twice): the next owner must resume where this one stopped, as
            // the ConsumerRebalanceListener docs advise. Every record a poll returned has
            // been processed when the listener runs (inside the next poll).
            try {
              consumer.commitSync();
            } catch (KafkaException notCommitted) {
              print("commit on revocation failed: " + notCommitted);
            }
            ownership("release", parts);
          }

          @Override
          public void onPartitionsAssigned(Collection<TopicPartition> parts) {
            ownership("acquire", parts);
          }

          @Override
          public void onPartitionsLost(Collection<TopicPartition> parts) {
            ownership("stop", parts);
          }
        });
    String host = System.getenv().getOrDefault("POD_IP", "0.0.0.0");
    HttpServer health =
        HttpServer.create(new InetSocketAddress(host, Integer.parseInt(args.get("--port"))), 0);
    health.createContext(
        "/healthz",
        exchange -> {
          exchange.sendResponseHeaders(200, -1);
          exchange.close();
        });
    health.start();
    try {
      while (true) {
        for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(100))) {
          if (workMillis > 0) {
            Thread.sleep(workMillis);
          }
          print(
              String.format(
                  "processed unit=%d offset=%d key=%s value=%s pod=%s",
                  record.partition(), record.offset(), text(record.key()), text(record.value()),
                  pod));
        }
      }
    } catch (WakeupException stopping) {
      // SIGTERM: close below commits and (unless static) leaves the group.
    } finally {
      consumer.close();
      ownership("release", List.copyOf(heldPartitions()));
      closed.countDown();
      health.stop(0);
    }
  }

  private static synchronized List<TopicPartition> heldPartitions() {
    return held.stream().map(p -> new TopicPartition("-", p)).toList();
  }

  private static String text(byte[] bytes) {
    return bytes == null ? "" : new String(bytes, StandardCharsets.UTF_8);
  }
}
