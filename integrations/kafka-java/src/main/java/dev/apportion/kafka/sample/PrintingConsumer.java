package dev.apportion.kafka.sample;

import dev.apportion.kafka.PartitionConsumer;
import com.sun.net.httpserver.HttpServer;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;

/**
 * The demo consumer of python -m apportion.kafka, in Java, with the same flags and the same log
 * lines (Unix time first), so tests/e2e/test_kafka.py and bench/bench_kafka.py read either:
 *
 * <pre>
 * 1718000000.123456 acquire unit=3 epoch=7 token=7 pod=c-0 set=PartitionSet/orders offset=120
 * 1718000000.223456 processed unit=3 offset=120 key=k7 value=k7:12 pod=c-0
 * 1718000001.123456 commit unit=3 epoch=7 token=7 pod=c-0 set=PartitionSet/orders offset=180
 * </pre>
 *
 * <p>{@code java dev.apportion.kafka.sample.PrintingConsumer --topic T --set S --bootstrap B
 * --group G [--work-time SECONDS] [--commit-interval SECONDS] [--port N]}, with {@code
 * POD_NAME}, {@code POD_NAMESPACE} and a kubeconfig or in-cluster credentials. With {@code
 * --port}, {@code GET /healthz} on {@code $POD_IP} answers 200 once the consumer has started: a
 * readiness probe, so that partitions go to consumers that can take them, not to a JVM still
 * starting.
 */
public final class PrintingConsumer {
  private PrintingConsumer() {}

  private static synchronized void print(String line) {
    Instant now = Instant.now();
    System.out.printf(Locale.ROOT, "%d.%06d %s%n", now.getEpochSecond(), now.getNano() / 1000, line);
    System.out.flush();
  }

  public static void main(String[] argv) throws Exception {
    Map<String, String> args = new HashMap<>(Map.of("--work-time", "0", "--commit-interval", "1"));
    for (int i = 0; i + 1 < argv.length; i += 2) {
      args.put(argv[i], argv[i + 1]);
    }
    for (String required : new String[] {"--topic", "--set", "--bootstrap", "--group"}) {
      if (!args.containsKey(required)) {
        System.err.println("PrintingConsumer: " + required + " is required");
        System.exit(2);
      }
    }
    String pod = System.getenv().getOrDefault("POD_NAME", "-");
    String set = "PartitionSet/" + args.get("--set");
    long workMillis = Math.round(Double.parseDouble(args.get("--work-time")) * 1000);
    Properties kafka = new Properties();
    kafka.put("bootstrap.servers", args.get("--bootstrap"));
    kafka.put("group.id", args.get("--group"));
    PartitionConsumer.Listener log =
        new PartitionConsumer.Listener() {
          @Override
          public void ownership(String action, int partition, long epoch, Long token, Long offset) {
            print(
                String.format(
                    "%s unit=%d epoch=%d token=%s pod=%s set=%s offset=%s",
                    action, partition, epoch, token == null ? "-" : token, pod, set,
                    offset == null ? "-" : offset));
          }

          @Override
          public void committed(int partition, long epoch, Long token, long offset) {
            print(
                String.format(
                    "commit unit=%d epoch=%d token=%s pod=%s set=%s offset=%d",
                    partition, epoch, token == null ? "-" : token, pod, set, offset));
          }
        };
    PartitionConsumer consumer =
        PartitionConsumer.fromEnvironment(
            args.get("--topic"),
            args.get("--set"),
            kafka,
            record -> {
              if (workMillis > 0) {
                Thread.sleep(workMillis);
              }
              print(
                  String.format(
                      "processed unit=%d offset=%d key=%s value=%s pod=%s",
                      record.partition(), record.offset(), text(record.key()), text(record.value()), pod));
            },
            Duration.ofMillis(Math.round(Double.parseDouble(args.get("--commit-interval")) * 1000)),
            log);
    consumer.installShutdownHook();
    consumer.start();
    if (args.containsKey("--port")) {
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
    }
    Thread.currentThread().join(); // consume until the JVM shuts down (SIGTERM hands over first)
  }

  private static String text(byte[] bytes) {
    return bytes == null ? "" : new String(bytes, StandardCharsets.UTF_8);
  }
}
