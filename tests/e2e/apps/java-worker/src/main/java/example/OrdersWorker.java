package example;

import dev.apportion.client.Worker;
import java.util.Set;
import java.util.TreeSet;
import java.util.stream.Collectors;

/**
 * A worker of a PartitionSet or ShardSet: one JSON line per callback on stdout, serving until
 * SIGTERM, which it answers by draining.
 */
public final class OrdersWorker {
  private OrdersWorker() {}

  private static synchronized void print(String event, Set<String> units, long epoch) {
    String listed =
        new TreeSet<>(units).stream().map(u -> '"' + u + '"').collect(Collectors.joining(","));
    System.out.println(
        "{\"event\": \"" + event + "\", \"units\": [" + listed + "], \"epoch\": " + epoch + "}");
    System.out.flush();
  }

  public static void main(String[] args) throws Exception {
    Worker.Callbacks callbacks =
        new Worker.Callbacks() {
          @Override
          public void onAcquire(Set<String> units, long epoch) {
            print("acquire", units, epoch);
          }

          @Override
          public void onRelease(Set<String> units, long epoch) {
            print("release", units, epoch);
          }

          @Override
          public void onRevoke(Set<String> units, long epoch) {
            print("revoke", units, epoch);
          }
        };
    Worker worker = Worker.fromEnvironment(args[0], args[1], callbacks);
    worker.start();
    worker.installShutdownHook();
    Thread.currentThread().join();
  }
}
