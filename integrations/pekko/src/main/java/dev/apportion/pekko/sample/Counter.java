package dev.apportion.pekko.sample;

import java.io.Serializable;
import org.apache.pekko.actor.typed.ActorRef;
import org.apache.pekko.actor.typed.Behavior;
import org.apache.pekko.actor.typed.PostStop;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.cluster.sharding.typed.javadsl.EntityTypeKey;

/**
 * The sample entity: counts the messages it got since it started. Logs one line when it starts,
 * per message and when it stops, each with the pod and the time, so a test can check that no
 * entity was alive on two nodes at once and that no message was lost:
 * {@code <unix seconds> start|msg|stop entity=<id> pod=<pod> [seq=<n> count=<c>]}.
 */
public final class Counter {
  public static final EntityTypeKey<Count> KEY = EntityTypeKey.create(Count.class, "counters");

  /** Message {@code seq} of a sender; the reply says who counted it and how many so far. */
  public record Count(long seq, ActorRef<Counted> replyTo) implements Serializable {}

  public record Counted(String entity, long seq, String pod, long count) implements Serializable {}

  private Counter() {}

  public static Behavior<Count> create(String entity, String pod) {
    return Behaviors.setup(ctx -> {
      log("start", entity, pod, "");
      long[] count = {0};
      return Behaviors.receive(Count.class)
          .onMessage(Count.class, m -> {
            count[0]++;
            log("msg", entity, pod, " seq=" + m.seq() + " count=" + count[0]);
            m.replyTo().tell(new Counted(entity, m.seq(), pod, count[0]));
            return Behaviors.same();
          })
          .onSignal(PostStop.class, s -> {
            log("stop", entity, pod, "");
            return Behaviors.same();
          })
          .build();
    });
  }

  private static void log(String what, String entity, String pod, String rest) {
    String line = String.format(java.util.Locale.ROOT, "%.3f %s entity=%s pod=%s%s%n",
        System.currentTimeMillis() / 1000.0, what, entity, pod, rest);
    // One write: Pekko's logger shares the pod's output, and a line cut in two would be lost.
    byte[] bytes = line.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    System.out.write(bytes, 0, bytes.length);
    System.out.flush();
  }
}
