package dev.apportion.client.sample;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.apportion.client.Worker;
import java.util.Set;
import java.util.TreeSet;

/**
 * The smallest worker: prints every callback as a JSON line ({@code {"event": "acquire",
 * "units": [...], "epoch": N}}) and serves until SIGTERM, which it answers by draining. The
 * end-to-end test tests/e2e/test_java_worker.py runs it as a pod's process.
 *
 * <p>{@code java dev.apportion.client.sample.PrintingWorker <SetKind> <set name>}, with
 * {@code POD_NAME}, {@code POD_NAMESPACE} and a kubeconfig or in-cluster credentials.
 */
public final class PrintingWorker {
  private static final ObjectMapper JSON = new ObjectMapper();

  private PrintingWorker() {}

  private static synchronized void print(String event, Set<String> units, long epoch) {
    ObjectNode line = JSON.createObjectNode().put("event", event);
    new TreeSet<>(units).forEach(line.putArray("units")::add);
    line.put("epoch", epoch);
    System.out.println(line);
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

          @Override
          public void onSuspend(Set<String> units, long epoch) {
            print("suspend", units, epoch);
          }

          @Override
          public void onResume(Set<String> units, long epoch) {
            print("resume", units, epoch);
          }
        };
    Worker worker = Worker.fromEnvironment(args[0], args[1], callbacks);
    worker.start();
    worker.installShutdownHook();
    print("started", Set.of(), worker.table() == null ? 0 : worker.table().epoch());
    Thread.currentThread().join(); // serve until the JVM shuts down (SIGTERM runs the drain)
  }
}
