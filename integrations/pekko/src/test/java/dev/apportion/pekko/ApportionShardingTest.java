package dev.apportion.pekko;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.typesafe.config.ConfigFactory;
import dev.apportion.client.AssignmentCodec;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import org.apache.pekko.actor.typed.ActorSystem;
import org.apache.pekko.actor.typed.javadsl.Behaviors;
import org.apache.pekko.cluster.MemberStatus;
import org.apache.pekko.cluster.typed.Cluster;
import org.apache.pekko.cluster.typed.Join;
import org.junit.jupiter.api.Test;

/** What the integration tells Pekko: where each shard should be, and which node is which pod. */
class ApportionShardingTest {
  private static final ObjectMapper JSON = new ObjectMapper();

  /**
   * The desired pod of every shard of a conformance table: a releasing shard's release target,
   * else its owner (none for an unowned one). The expectation is read from the case's own
   * "expect" part, which tests/unit/test_conformance.py holds the Python reader to.
   */
  @Test
  void shardsGoWhereTheTableSaysAndReleasingOnesToTheirTarget() throws Exception {
    JsonNode cases = JSON.readTree(
        Path.of(System.getProperty("conformance.dir"), "tables", "indexed-unowned-releasing.json")
            .toFile());
    Map<String, String> expected = new HashMap<>();
    for (Iterator<Map.Entry<String, JsonNode>> it = cases.get("expect").get("units").fields();
        it.hasNext(); ) {
      Map.Entry<String, JsonNode> unit = it.next();
      JsonNode state = unit.getValue();
      JsonNode to = state.path("releasing").path("to");
      expected.put(unit.getKey(), to.isTextual() ? to.asText() : state.get("owner").textValue());
    }
    assertEquals("carts-a", expected.get("3")); // the case does have a release in it
    assertEquals(
        expected, ApportionSharding.desiredPods(AssignmentCodec.fromDocument(cases.get("document"))));
  }

  /** A real one-node cluster: the member carrying role pod:p-0 is p-0's address, once Up. */
  @Test
  void aMemberIsThePodItsRoleNames() throws Exception {
    ActorSystem<Void> system =
        ActorSystem.create(
            Behaviors.empty(),
            "Test",
            ConfigFactory.parseString(String.join("\n",
                    "pekko.actor.provider = cluster",
                    "pekko.remote.artery.canonical.hostname = \"127.0.0.1\"",
                    "pekko.remote.artery.canonical.port = 0",
                    "pekko.cluster.roles = [\"pod:p-0\", \"backend\"]",
                    "pekko.jvm-shutdown-hooks = off"))
                .withFallback(ConfigFactory.load()));
    try {
      Cluster cluster = Cluster.get(system);
      assertEquals(Map.of(), ApportionSharding.podAddresses(cluster.state().getMembers()));
      cluster.manager().tell(Join.create(cluster.selfMember().address()));
      long deadline = System.nanoTime() + Duration.ofSeconds(20).toNanos();
      while (cluster.selfMember().status() != MemberStatus.up() && System.nanoTime() < deadline) {
        Thread.sleep(50);
      }
      assertEquals(
          Map.of("p-0", cluster.selfMember().address()),
          ApportionSharding.podAddresses(cluster.state().getMembers()));
    } finally {
      system.terminate();
      system.getWhenTerminated().toCompletableFuture().get();
    }
  }

  /** An app's own roles survive: HOCON lists do not merge, so a plain fallback would drop them. */
  @Test
  void thePodRoleIsAddedToTheAppsOwnRoles() {
    var app = ConfigFactory.parseString("pekko.cluster.roles = [web, backend]\nshop.x = 1");
    var config = ApportionSharding.podConfig(app, "shop-2");
    assertEquals(
        java.util.List.of("web", "backend", "pod:shop-2"),
        config.getStringList("pekko.cluster.roles"));
    assertEquals(1, config.getInt("shop.x"));
    assertEquals("off", config.getString("pekko.jvm-shutdown-hooks"));
    assertEquals(
        java.util.List.of("pod:shop-0"),
        ApportionSharding.podConfig(ConfigFactory.empty(), "shop-0")
            .getStringList("pekko.cluster.roles"));
  }
}
