package dev.apportion.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** The Java client against the language-neutral cases of conformance/ (the Python suite
 * tests/unit/test_conformance.py reads the same files; conformance/README.md says what they mean). */
class ConformanceTest {
  static final ObjectMapper JSON = new ObjectMapper();
  static final Path DIR = Path.of(System.getProperty("conformance.dir", "../../conformance"));

  /** JSON equality where 1, 1L and 1.0 are the same number. */
  static final Comparator<JsonNode> NUMERIC =
      (a, b) -> {
        if (a.isNumber() && b.isNumber()) {
          return a.decimalValue().compareTo(b.decimalValue());
        }
        return a.equals(b) ? 0 : 1;
      };

  static JsonNode read(Path path) {
    try {
      return JSON.readTree(path.toFile());
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  static List<Path> files(String dir) throws IOException {
    try (Stream<Path> paths = Files.list(DIR.resolve(dir))) {
      return paths.filter(p -> p.toString().endsWith(".json")).sorted().toList();
    }
  }

  static void assertJson(JsonNode expected, JsonNode actual, String what) {
    if (!expected.equals(NUMERIC, actual)) {
      fail(what + ":\nexpected " + expected + "\nactual   " + actual);
    }
  }

  static Map<String, String> strings(JsonNode object) {
    Map<String, String> map = new HashMap<>();
    if (object != null) {
      object.properties().forEach(e -> map.put(e.getKey(), e.getValue().asText()));
    }
    return map;
  }

  /** The table in the cases' normal form. */
  static JsonNode normalized(AssignmentTable table) {
    ObjectNode doc = JSON.createObjectNode();
    ObjectNode set = doc.putObject("set");
    set.put("kind", table.set().kind());
    set.put("namespace", table.set().namespace());
    set.put("name", table.set().name());
    set.put("uid", table.set().uid());
    doc.put("generation", table.generation());
    doc.put("keyScheme", table.keyScheme());
    doc.put("count", table.count());
    doc.put("epoch", table.epoch());
    doc.put("ackAnnotation", table.ackAnnotation());
    var members = doc.putArray("members");
    table.members().forEach(m -> members.addObject().put("name", m.name()).put("uid", m.uid()));
    ObjectNode units = doc.putObject("units");
    table
        .units()
        .forEach(
            (unit, state) -> {
              ObjectNode entry = units.putObject(unit);
              entry.put("owner", state.owner());
              entry.put("epoch", state.epoch());
              if (state.releasing() != null) {
                entry
                    .putObject("releasing")
                    .put("to", state.releasing().to())
                    .put("since", state.releasing().since())
                    .put("epoch", state.releasing().epoch());
              }
            });
    Lineage lineage = table.lineage();
    if (lineage == null) {
      doc.putNull("lineage");
    } else {
      ObjectNode l = doc.putObject("lineage");
      l.put("fromCount", lineage.fromCount());
      l.put("toCount", lineage.toCount());
      l.put("epoch", lineage.epoch());
      lineage.parentEpochs().forEach(l.putArray("parentEpochs")::add);
    }
    if (table.servingLease() == null) {
      doc.putNull("servingLease");
    } else {
      doc.put("servingLease", table.servingLease());
    }
    return doc;
  }

  @Test
  void everyStoredWayOfEveryCaseIsThere() throws IOException {
    Set<String> stored = new TreeSet<>();
    for (Path path : files("tables/stored")) {
      JsonNode s = read(path);
      stored.add(s.get("case").asText() + "." + s.get("storage").asText());
    }
    List<Path> cases = files("tables");
    assertTrue(cases.size() > 20);
    for (Path c : cases) {
      String name = c.getFileName().toString().replace(".json", "");
      for (String way : List.of("plain", "gzip", "chunked")) {
        assertTrue(stored.contains(name + "." + way), name + "." + way);
      }
    }
  }

  @TestFactory
  Stream<DynamicTest> storedTables() throws IOException {
    return files("tables/stored").stream()
        .map(path -> DynamicTest.dynamicTest(path.getFileName().toString(), () -> storedTable(path)));
  }

  static void storedTable(Path path) throws AssignmentFormatException {
    JsonNode stored = read(path);
    JsonNode c = read(DIR.resolve("tables").resolve(stored.get("case").asText() + ".json"));
    String error = stored.has("error") ? stored.get("error").asText() : c.path("error").asText(null);
    String root = stored.get("name").asText();
    List<ConfigMapPayload> payloads = new ArrayList<>();
    for (JsonNode cm : stored.get("configmaps")) {
      payloads.add(
          ConfigMapPayload.of(
              cm.get("metadata").get("name").asText(), root, strings(cm.get("data")), strings(cm.get("binaryData"))));
    }
    if (error == null) {
      assertJson(c.get("expect"), normalized(AssignmentCodec.decode(payloads)), path.toString());
    } else if (error.equals("incomplete")) {
      assertThrows(IncompleteAssignmentException.class, () -> AssignmentCodec.decode(payloads));
    } else {
      AssignmentFormatException e =
          assertThrows(AssignmentFormatException.class, () -> AssignmentCodec.decode(payloads));
      assertTrue(!(e instanceof IncompleteAssignmentException), e.getMessage());
    }
  }

  @TestFactory
  Stream<DynamicTest> keyVectors() throws IOException {
    return files("keys").stream()
        .map(path -> DynamicTest.dynamicTest(path.getFileName().toString(), () -> keyVectors(path)));
  }

  static void keyVectors(Path path) {
    JsonNode cases = read(path);
    KeyScheme scheme = KeyScheme.named(cases.get("scheme").asText());
    assertTrue(cases.get("vectors").size() > 20);
    for (JsonNode v : cases.get("vectors")) {
      String key = v.get("key").asText();
      String hash = v.get("hash").asText();
      switch (scheme) {
        case APPORTION -> assertEquals(hash, String.format("%016x", KeyScheme.xxh3(key)), key);
        case NETHERITE -> assertEquals(hash, String.format("%08x", KeyScheme.fnv1a32(KeyScheme.utf8(key))), key);
        case AKKA -> assertEquals(Integer.parseInt(hash), key.hashCode(), key);
      }
      if (scheme == KeyScheme.APPORTION && KeyScheme.suffixIndex(key) < 0) {
        // The unit's hash range (resharding callbacks get it) holds the key's hash.
        java.math.BigInteger h = new java.math.BigInteger(hash, 16);
        for (Map.Entry<String, JsonNode> e : v.get("units").properties()) {
          UnitRange range = UnitRange.of(e.getValue().asText(), Integer.parseInt(e.getKey()));
          assertTrue(range.lo().compareTo(h) <= 0 && h.compareTo(range.hi()) < 0, key + " in " + range);
        }
      }
      v.get("units")
          .properties()
          .forEach(
              e ->
                  assertEquals(
                      e.getValue().asInt(),
                      scheme.unit(key, Integer.parseInt(e.getKey())),
                      key + " of " + e.getKey()));
    }
  }

  @Test
  void names() {
    JsonNode cases = read(DIR.resolve("names.json"));
    assertTrue(cases.size() > 4);
    for (JsonNode c : cases) {
      String kind = c.get("kind").asText();
      String name = c.get("name").asText();
      assertEquals(c.get("configMap").asText(), Names.assignmentConfigMap(kind, name));
      assertEquals(c.get("ackAnnotation").asText(), Names.ackAnnotation(kind, name));
    }
  }

  @TestFactory
  Stream<DynamicTest> workerSequences() throws IOException {
    return files("worker").stream()
        .map(path -> DynamicTest.dynamicTest(path.getFileName().toString(), () -> workerSequence(path)));
  }

  /** Plays the case's steps against WorkerState; callbacks return at once unless the step says
   * {@code pause}, then they run until a later step completes (or fails) them; a failed release
   * runs on (it is retried) until a {@code retry} finds its unit taken away. */
  static void workerSequence(Path path) throws AssignmentFormatException {
    JsonNode c = read(path);
    Incarnation me = new Incarnation(c.get("me").get("name").asText(), c.get("me").get("uid").asText());
    JsonNode set = c.get("set");
    WorkerState state =
        new WorkerState(me, set.get("kind").asText(), set.get("namespace").asText(), set.get("name").asText());
    Map<String, List<String>> running = new HashMap<>(); // unit -> callbacks not returned, in order
    Map<String, java.util.function.Consumer<String>> finish =
        Map.of(
            "stop", u -> state.stopped(Set.of(u)),
            "release", u -> state.released(Set.of(u)),
            "acquire", u -> state.acquired(Set.of(u), true),
            "fail", u -> state.acquired(Set.of(u), false),
            "reshard", u -> state.resharded(Set.of(u), true));
    int number = 0;
    for (JsonNode step : c.get("steps")) {
      ObjectNode did = JSON.createObjectNode();
      did.putNull("reshape");
      if (step.has("table")) {
        did.put("handled", state.receive(AssignmentCodec.fromDocument(step.get("table"))));
      } else if (step.has("found")) {
        state.ackWritten(Ack.fromAnnotation(step.get("found").toString()));
      } else if (step.path("signal").asText().equals("resumed")) {
        state.resumed(step.get("suspendedFor").asDouble());
      } else if (step.has("signal")) {
        assertEquals("drain", step.get("signal").asText());
        state.startDraining();
      }
      for (JsonNode unit : step.path("complete")) {
        running.remove(unit.asText()).forEach(kind -> finish.get(kind).accept(unit.asText()));
      }
      for (JsonNode unit : step.path("fail")) {
        if (running.get(unit.asText()).equals(List.of("release"))) { // retried: still running
          state.releaseFailed(Set.of(unit.asText()), "callback failed");
        } else {
          assertEquals(List.of("acquire"), running.remove(unit.asText()));
          finish.get("fail").accept(unit.asText());
        }
      }
      for (JsonNode unit : step.path("retry")) {
        if (state.retryWanted(Set.of(unit.asText())).isEmpty()) { // taken away: given up
          state.releaseAbandoned(Set.of(unit.asText()));
          assertEquals(List.of("release"), running.remove(unit.asText()));
        }
      }
      boolean pause = step.path("pause").asBoolean(false);
      TreeSet<String> stop = new TreeSet<>(Units.ORDER);
      TreeSet<String> release = new TreeSet<>(Units.ORDER);
      TreeMap<String, Long> acquire = new TreeMap<>(Units.ORDER);
      WorkerState.Transition t;
      while ((t = state.nextTransition()) != null) {
        stop.addAll(t.stop());
        release.addAll(t.release());
        acquire.putAll(t.tokens());
        Set<String> carried = Set.of();
        if (t.resharding() != null && !t.resharding().carried().isEmpty()) {
          carried = t.resharding().carried().keySet();
          ObjectNode reshape = did.putObject("reshape");
          reshape.set("carried", JSON.valueToTree(new TreeMap<>(t.resharding().carried())));
          reshape.set("load", JSON.valueToTree(new TreeMap<>(t.resharding().load())));
        }
        Map<String, Set<String>> started =
            Map.of("stop", t.stop(), "reshard", carried, "release", t.release(), "acquire", t.acquire());
        for (String kind : List.of("stop", "reshard", "release", "acquire")) {
          for (String unit : started.get(kind)) {
            if (pause) {
              running.computeIfAbsent(unit, u -> new ArrayList<>()).add(kind);
            } else {
              finish.get(kind).accept(unit);
            }
          }
        }
      }
      Ack ack = state.ackDue();
      if (ack != null) {
        state.ackWritten(ack);
      }
      stop.forEach(did.putArray("stop")::add);
      release.forEach(did.putArray("release")::add);
      ObjectNode tokens = did.putObject("acquire");
      acquire.forEach(tokens::put);
      did.set("ack", ack == null ? JSON.nullNode() : read(ack.toAnnotation()));
      TreeSet<String> owns = new TreeSet<>(Units.ORDER);
      owns.addAll(state.myUnits());
      owns.forEach(did.putArray("owns")::add);
      ObjectNode held = did.putObject("tokens");
      new TreeMap<>(state.held()).forEach(held::put);
      did.put("drained", state.drained());

      ObjectNode expected = JSON.createObjectNode();
      expected.putArray("stop");
      expected.putArray("release");
      expected.putObject("acquire");
      expected.putNull("reshape");
      expected.setAll((ObjectNode) step.get("expect"));
      ObjectNode actual = JSON.createObjectNode();
      expected.fieldNames().forEachRemaining(k -> actual.set(k, did.get(k)));
      assertJson(expected, actual, path.getFileName() + " step " + number++ + ": " + step.path("why").asText());
    }
  }

  static JsonNode read(String text) {
    try {
      return JSON.readTree(text);
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }
}
