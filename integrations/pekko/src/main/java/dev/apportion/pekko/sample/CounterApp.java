package dev.apportion.pekko.sample;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import com.typesafe.config.Config;
import com.typesafe.config.ConfigFactory;
import dev.apportion.pekko.ApportionSharding;
import io.fabric8.kubernetes.api.model.Pod;
import io.fabric8.kubernetes.client.KubernetesClient;
import io.fabric8.kubernetes.client.KubernetesClientBuilder;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.sharding.typed.ShardingEnvelope;
import org.apache.pekko.cluster.sharding.typed.ShardingMessageExtractor;
import org.apache.pekko.cluster.sharding.typed.javadsl.ClusterSharding;
import org.apache.pekko.cluster.sharding.typed.javadsl.Entity;
import org.apache.pekko.cluster.typed.Cluster;

/**
 * The sample: a Pekko cluster of {@link Counter} entities placed by ShardSet {@code <set>}.
 *
 * <p>{@code CounterApp <set> <shards> <statefulset>}, in a pod of StatefulSet {@code
 * <statefulset>} with {@code POD_NAME}, {@code POD_NAMESPACE} and {@code POD_IP}. Artery listens
 * on the pod IP, port 2551; seed nodes are found through the API (see {@link #seedNodes}). HTTP
 * on the pod IP, port 8080:
 * {@code /ready} (200 once this node is Up: the readiness probe, so apportion places shards only
 * on members), {@code /send?entity=E&seq=N} (a Count message, answered with the Counted reply
 * as JSON), {@code /view} (GetClusterShardingStats: pod → shards) and {@code /local}
 * (GetShardRegionState of this node). With {@code COUNTER_ALLOCATION=pekko} Pekko places the
 * shards with its own strategy instead (the ShardSet is not read): a baseline for benchmarks.
 */
public final class CounterApp {
  private static final int PEKKO_PORT = 2551;
  private static final int HTTP_PORT = 8080;
  private static final Duration ASK = Duration.ofSeconds(5);
  private static final ObjectMapper JSON = new ObjectMapper();

  private CounterApp() {}

  public static void main(String[] args) throws Exception {
    // Pekko's log lines and the entities' lines through one (synchronized) stream: never mixed.
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.out");
    // Pekko's lines with their time (UTC), to line them up with the entities' and apportion's.
    System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
    System.setProperty("org.slf4j.simpleLogger.dateTimeFormat", "HH:mm:ss.SSS");
    // apportion's own lines (java.util.logging) with unix seconds, as the entities' lines.
    System.setProperty("java.util.logging.SimpleFormatter.format",
        "%1$ts.%1$tL %4$s %3$s %5$s%6$s%n");
    String set = args[0];
    int shards = Integer.parseInt(args[1]);
    String pod = System.getenv("POD_NAME");
    String ip = System.getenv("POD_IP");
    // COUNTER_ALLOCATION=pekko: Pekko's own LeastShardAllocationStrategy and shutdown, no
    // ShardSet, Pekko's defaults unless -D settings override them: the baseline
    // bench/bench_pekko.py runs beside apportion's placement.
    boolean own = "pekko".equals(System.getenv("COUNTER_ALLOCATION"));
    String seeds = String.join("\", \"", seedNodes(args[2], pod, ip));
    Config common = ConfigFactory.parseString(String.join("\n",
        "pekko.actor.provider = cluster",
        "pekko.remote.artery.canonical.hostname = \"" + ip + "\"",
        "pekko.remote.artery.canonical.port = " + PEKKO_PORT,
        "pekko.cluster.seed-nodes = [\"" + seeds + "\"]",
        "pekko.cluster.downing-provider-class = "
            + "\"org.apache.pekko.cluster.sbr.SplitBrainResolverProvider\"",
        "pekko.cluster.distributed-data.gossip-interval = 500ms",
        // Entities live until their shard moves (the test counts every start and stop).
        "pekko.cluster.sharding.passivation.strategy = none",
        // The sample's messages are records; a real app would use Jackson or protobuf.
        "pekko.actor.allow-java-serialization = on",
        "pekko.actor.warn-about-java-serializer-usage = off"));
    Config config = own
        // The pod: role only to show /view by pod, as with apportion.
        ? ConfigFactory.parseString("pekko.cluster.roles = [\"" + ApportionSharding.POD_ROLE
                + pod + "\"]")
            .withFallback(common).withFallback(ConfigFactory.load())
        : ApportionSharding.podConfig(ConfigFactory.parseString(String.join("\n",
                // Moves at most a second after apportion asks; the table spreads by gossip.
                "pekko.cluster.sharding.rebalance-interval = 1s",
                // A shard's entities run only while apportion's serving lease of it holds: a
                // node cut off from the API server stops them before the operator can move
                // the shard (docs/pekko.md). A refused lease is asked again after a second.
                "pekko.cluster.sharding.use-lease = \"dev.apportion.pekko.shard-lease\"",
                "pekko.cluster.sharding.lease-retry-interval = 1s"))
            .withFallback(common).withFallback(ConfigFactory.load()));
    ActorSystem<Void> system = ActorSystem.create(Behaviors.empty(), "Counters", config);

    Entity<Counter.Count, ShardingEnvelope<Counter.Count>> entity =
        Entity.of(Counter.KEY, ctx -> Counter.create(ctx.getEntityId(), pod));
    ClusterSharding sharding = ClusterSharding.get(system);
    if (own) {
      // The same shard of every entity as under apportion (the akka key scheme).
      sharding.init(entity.withMessageExtractor(ShardingMessageExtractor.apply(shards)));
    } else {
      ApportionSharding<Counter.Count> apportion =
          ApportionSharding.start(system, Counter.KEY, set, shards);
      sharding.init(apportion.entity(entity));
      apportion.installShutdownHook(Duration.ofSeconds(25));
    }

    HttpServer http = HttpServer.create(new InetSocketAddress(ip, HTTP_PORT), 64);
    http.setExecutor(Executors.newFixedThreadPool(16));
    http.createContext("/ready", ex -> reply(ex,
        Cluster.get(system).selfMember().status() == MemberStatus.up() ? 200 : 503, "ready"));
    http.createContext("/send", ex -> {
      Map<String, String> q = query(ex.getRequestURI());
      try {
        Counter.Counted counted = sharding.entityRefFor(Counter.KEY, q.get("entity"))
            .<Counter.Counted>ask(r -> new Counter.Count(Long.parseLong(q.get("seq")), r), ASK)
            .toCompletableFuture().get();
        reply(ex, 200, JSON.writeValueAsString(counted));
      } catch (Exception e) {
        reply(ex, 500, String.valueOf(e));
      }
    });
    http.createContext("/view", ex -> {
      try {
        reply(ex, 200, JSON.writeValueAsString(ApportionSharding.clusterView(system, Counter.KEY)));
      } catch (Exception e) {
        reply(ex, 500, String.valueOf(e));
      }
    });
    http.createContext("/local", ex -> {
      try {
        reply(ex, 200, JSON.writeValueAsString(ApportionSharding.localShards(system, Counter.KEY)));
      } catch (Exception e) {
        reply(ex, 500, String.valueOf(e));
      }
    });
    http.start();
    System.out.println("started pod=" + pod + " address=" + Cluster.get(system).selfMember().address());
  }

  /**
   * Where to join: the other Ready pods of the StatefulSet (Ready means an Up member), read with
   * nothing but {@code get pods}, which the apportion-worker role grants (a real app would use
   * Pekko Management's Kubernetes discovery). With none, the lowest ordinal starts the cluster by
   * seeding itself and the others wait: a pod restarted in a rolling update joins its peers
   * instead of forming a second cluster of its own.
   */
  private static List<String> seedNodes(String statefulSet, String self, String selfIp)
      throws InterruptedException {
    try (KubernetesClient client = new KubernetesClientBuilder().build()) {
      String namespace = System.getenv("POD_NAMESPACE");
      while (true) {
        List<String> peers = new ArrayList<>();
        String lowest = null;
        for (int ordinal = 0; ; ordinal++) { // StatefulSet ordinals are contiguous from 0
          Pod p = client.pods().inNamespace(namespace).withName(statefulSet + "-" + ordinal).get();
          if (p == null) {
            break;
          }
          String name = p.getMetadata().getName();
          boolean leaving = p.getMetadata().getDeletionTimestamp() != null;
          lowest = lowest == null && !leaving ? name : lowest;
          if (!name.equals(self) && !leaving && isReady(p)) {
            peers.add(address(p.getStatus().getPodIP()));
          }
        }
        if (!peers.isEmpty()) {
          return peers;
        }
        if (self.equals(lowest)) {
          return List.of(address(selfIp));
        }
        Thread.sleep(500);
      }
    }
  }

  private static boolean isReady(Pod pod) {
    return pod.getStatus() != null
        && pod.getStatus().getConditions().stream()
            .anyMatch(c -> "Ready".equals(c.getType()) && "True".equals(c.getStatus()));
  }

  private static String address(String ip) {
    return "pekko://Counters@" + ip + ":" + PEKKO_PORT;
  }

  private static Map<String, String> query(URI uri) {
    Map<String, String> q = new HashMap<>();
    String raw = uri.getRawQuery();
    if (raw != null) {
      for (String pair : raw.split("&")) {
        String[] kv = pair.split("=", 2);
        q.put(java.net.URLDecoder.decode(kv[0], StandardCharsets.UTF_8),
            kv.length > 1 ? java.net.URLDecoder.decode(kv[1], StandardCharsets.UTF_8) : "");
      }
    }
    return q;
  }

  private static void reply(HttpExchange ex, int status, String body) throws IOException {
    byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
    ex.getResponseHeaders().set("Content-Type", "application/json");
    ex.sendResponseHeaders(status, bytes.length);
    try (var out = ex.getResponseBody()) {
      out.write(bytes);
    }
  }
}
