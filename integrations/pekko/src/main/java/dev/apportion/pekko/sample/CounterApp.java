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
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.Executors;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.sharding.typed.javadsl.ClusterSharding;
import org.apache.pekko.cluster.sharding.typed.javadsl.Entity;
import org.apache.pekko.cluster.typed.Cluster;

/**
 * The sample: a Pekko cluster of {@link Counter} entities placed by ShardSet {@code <set>}.
 *
 * <p>{@code CounterApp <set> <shards> <seed-pod>}, in a pod with {@code POD_NAME},
 * {@code POD_NAMESPACE} and {@code POD_IP}. Artery listens on the pod IP, port 2551; the cluster
 * is seeded by pod {@code <seed-pod>} (its IP read from the API). HTTP on the pod IP, port 8080:
 * {@code /ready} (200 once this node is Up: the readiness probe, so apportion places shards only
 * on members), {@code /send?entity=E&seq=N} (a Count message, answered with the Counted reply
 * as JSON), {@code /view} (GetClusterShardingStats: pod → shards) and {@code /local}
 * (GetShardRegionState of this node).
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
    String set = args[0];
    int shards = Integer.parseInt(args[1]);
    String pod = System.getenv("POD_NAME");
    String ip = System.getenv("POD_IP");
    String seed = seedAddress(args[2]);
    Config config =
        ApportionSharding.podConfig()
            .withFallback(ConfigFactory.parseString(String.join("\n",
                "pekko.actor.provider = cluster",
                "pekko.remote.artery.canonical.hostname = \"" + ip + "\"",
                "pekko.remote.artery.canonical.port = " + PEKKO_PORT,
                "pekko.cluster.seed-nodes = [\"" + seed + "\"]",
                "pekko.cluster.downing-provider-class = "
                    + "\"org.apache.pekko.cluster.sbr.SplitBrainResolverProvider\"",
                // Moves at most a second after apportion asks; the table spreads by gossip.
                "pekko.cluster.sharding.rebalance-interval = 1s",
                "pekko.cluster.distributed-data.gossip-interval = 500ms",
                // Entities live until their shard moves (the test counts every start and stop).
                "pekko.cluster.sharding.passivation.strategy = none",
                // The sample's messages are records; a real app would use Jackson or protobuf.
                "pekko.actor.allow-java-serialization = on",
                "pekko.actor.warn-about-java-serializer-usage = off")))
            .withFallback(ConfigFactory.load());
    ActorSystem<Void> system = ActorSystem.create(Behaviors.empty(), "Counters", config);

    ApportionSharding<Counter.Count> apportion =
        ApportionSharding.start(system, Counter.KEY, set, shards);
    ClusterSharding sharding = ClusterSharding.get(system);
    sharding.init(apportion.entity(
        Entity.of(Counter.KEY, ctx -> Counter.create(ctx.getEntityId(), pod))));
    apportion.installShutdownHook(Duration.ofSeconds(25));

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
        reply(ex, 200, JSON.writeValueAsString(apportion.clusterView()));
      } catch (Exception e) {
        reply(ex, 500, String.valueOf(e));
      }
    });
    http.createContext("/local", ex -> {
      try {
        reply(ex, 200, JSON.writeValueAsString(apportion.localShards()));
      } catch (Exception e) {
        reply(ex, 500, String.valueOf(e));
      }
    });
    http.start();
    System.out.println("started pod=" + pod + " address=" + Cluster.get(system).selfMember().address());
  }

  /** The seed node: pod {@code seedPod}'s IP once the API has one. */
  private static String seedAddress(String seedPod) throws InterruptedException {
    try (KubernetesClient client = new KubernetesClientBuilder().build()) {
      String namespace = System.getenv("POD_NAMESPACE");
      while (true) {
        Pod p = client.pods().inNamespace(namespace).withName(seedPod).get();
        String ip = p == null || p.getStatus() == null ? null : p.getStatus().getPodIP();
        if (ip != null && !ip.isEmpty()) {
          return "pekko://Counters@" + ip + ":" + PEKKO_PORT;
        }
        Thread.sleep(200);
      }
    }
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
