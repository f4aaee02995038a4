package dev.apportion.client.fencing;

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
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.CyclicBarrier;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * {@link PostgresFence} against a real PostgreSQL server ({@link PostgresServer}, one for the
 * class): the shared cases of conformance/fencing (tests/unit/test_fencing.py plays the same
 * files against the Python client), competing writers on many connections judged by the commit
 * order the database records, and the guards of the API.
 */
class PostgresFenceTest {
  static final ObjectMapper JSON = new ObjectMapper();
  static final Path CASES =
      Path.of(System.getProperty("conformance.dir", "../../conformance")).resolve("fencing");
  static final String DATA =
      "CREATE TABLE fencing_data (scope text, unit text, value text, PRIMARY KEY (scope, unit))";
  static final String UPSERT =
      "INSERT INTO fencing_data (scope, unit, value) VALUES (?, ?, ?)"
          + " ON CONFLICT (scope, unit) DO UPDATE SET value = EXCLUDED.value";
  /** The application's statement that fails after the fence accepted (conformance "fail"). */
  static final String FAIL = "SELECT 1 / 0";

  static final String DIVISION_BY_ZERO = "22012";
  static final String FENCE = "apportion_fence";
  static final String DATA_TABLE = "fencing_data";

  static PostgresServer server;

  @BeforeAll
  static void startServer() throws Exception {
    server = PostgresServer.start();
  }

  @AfterAll
  static void stopServer() throws Exception {
    if (server != null) {
      server.close();
    }
  }

  static void execute(Connection connection, String sql) throws SQLException {
    try (Statement statement = connection.createStatement()) {
      statement.execute(sql);
    }
  }

  /** JSON equality where 1 and 1L are the same number. */
  static void assertJson(JsonNode expected, JsonNode actual) {
    Comparator<JsonNode> numeric =
        (a, b) -> a.isNumber() && b.isNumber()
            ? a.decimalValue().compareTo(b.decimalValue())
            : a.equals(b) ? 0 : 1;
    if (!expected.equals(numeric, actual)) {
      fail("expected " + expected + "\nactual   " + actual);
    }
  }

  /** scope -> unit -> value of a (scope, unit, value) query, as the cases write it. */
  static JsonNode contents(Connection connection, String query) throws SQLException {
    ObjectNode out = JSON.createObjectNode();
    try (Statement statement = connection.createStatement();
        ResultSet rows = statement.executeQuery(query)) {
      while (rows.next()) {
        JsonNode seen = out.get(rows.getString(1));
        ObjectNode scope = seen != null ? (ObjectNode) seen : out.putObject(rows.getString(1));
        Object value = rows.getObject(3);
        if (value instanceof Long token) {
          scope.put(rows.getString(2), token);
        } else {
          scope.put(rows.getString(2), (String) value);
        }
      }
    }
    return out;
  }

  // ---------------------------------------------------------------------- conformance cases

  @TestFactory
  Stream<DynamicTest> conformanceCases() throws IOException {
    List<Path> files;
    try (Stream<Path> paths = Files.list(CASES)) {
      files = paths.filter(p -> p.toString().endsWith(".json")).sorted().toList();
    }
    assertTrue(files.size() >= 8, "cases in " + CASES);
    return files.stream()
        .map(path -> DynamicTest.dynamicTest(path.getFileName().toString(), () -> play(path)));
  }

  static void play(Path path) throws Exception {
    JsonNode c = JSON.readTree(path.toFile());
    try (Connection connection = DriverManager.getConnection(server.createDatabase("case"))) {
      execute(connection, DATA);
      new PostgresFence(connection, "").ensureSchema();
      int i = 0;
      for (JsonNode step : c.get("writes")) {
        String scope = step.get("scope").asText();
        String unit = step.get("unit").asText();
        String outcome;
        Long current = null;
        try {
          new PostgresFence(connection, scope)
              .write(
                  unit,
                  step.get("token").longValue(),
                  db -> {
                    try (PreparedStatement upsert = db.prepareStatement(UPSERT)) {
                      upsert.setString(1, scope);
                      upsert.setString(2, unit);
                      upsert.setString(3, step.get("value").asText());
                      upsert.executeUpdate();
                    }
                    if (step.path("fail").asBoolean()) {
                      execute(db, FAIL);
                    }
                    return null;
                  });
          outcome = "accepted";
        } catch (StaleTokenException refused) {
          outcome = "stale";
          current = refused.current();
        } catch (SQLException e) {
          if (!DIVISION_BY_ZERO.equals(e.getSQLState())) {
            throw e;
          }
          outcome = "failed";
        }
        String what = path.getFileName() + " write " + i++ + ": " + step;
        assertEquals(step.get("expect").asText(), outcome, what);
        assertEquals(step.has("current") ? step.get("current").longValue() : null, current, what);
      }
      assertJson(c.get("fence"), contents(connection, "SELECT scope, unit, token FROM " + FENCE));
      assertJson(c.get("data"), contents(connection, "SELECT scope, unit, value FROM " + DATA_TABLE));
    }
  }

  // ---------------------------------------------------------------------- competing writers

  /**
   * The last statement of every accepted write: its number in commit order. A sequence would
   * not do (nextval is taken when the statement runs, so it shows commit order only if the fence
   * serializes the writers, which is under test); the counter's row stays locked from the
   * increment to the commit, so the numbers follow the commits whatever the fence does.
   */
  static final String RECORD =
      "WITH next AS (UPDATE commit_order SET n = n + 1 RETURNING n)"
          + " INSERT INTO accepted (seq, unit, token) SELECT n, ?, ? FROM next";

  record Accepted(String unit, long token) {}

  /** A refusal, with the last commit number when it was seen. */
  record Refused(String unit, long token, Long current, long seen) {}

  record Row(long seq, String unit, long token) {
    Accepted accepted() {
      return new Accepted(unit, token);
    }
  }

  @Test
  void competingWritersCommitInTokenOrder() throws Exception {
    String url = server.createDatabase("race");
    try (Connection connection = DriverManager.getConnection(url)) {
      execute(connection, "CREATE TABLE commit_order (n bigint NOT NULL)");
      execute(connection, "INSERT INTO commit_order VALUES (0)");
      execute(
          connection,
          "CREATE TABLE accepted (seq bigint PRIMARY KEY, unit text NOT NULL, token bigint)");
      new PostgresFence(connection, "").ensureSchema();
    }
    List<Accepted> accepted = Collections.synchronizedList(new ArrayList<>());
    List<Refused> refused = Collections.synchronizedList(new ArrayList<>());
    List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
    List<Thread> threads = new ArrayList<>();
    for (int seed = 0; seed < 8; seed++) {
      Random random = new Random(seed);
      threads.add(
          new Thread(
              () -> {
                try (Connection connection = DriverManager.getConnection(url)) {
                  PostgresFence fence = new PostgresFence(connection, "race");
                  for (int i = 0; i < 40; i++) {
                    String unit = String.valueOf("abc".charAt(random.nextInt(3)));
                    long token = 1 + random.nextInt(30);
                    try {
                      fence.write(
                          unit,
                          token,
                          db -> {
                            // hold the unit a while: writers queue up
                            execute(db, "SELECT pg_sleep(random() / 1000)");
                            try (PreparedStatement record = db.prepareStatement(RECORD)) {
                              record.setString(1, unit);
                              record.setLong(2, token);
                              return record.executeUpdate();
                            }
                          });
                      accepted.add(new Accepted(unit, token));
                    } catch (StaleTokenException e) {
                      refused.add(new Refused(unit, token, e.current(), lastSeq(connection)));
                    }
                  }
                } catch (Throwable e) {
                  errors.add(e);
                }
              }));
    }
    threads.forEach(Thread::start);
    for (Thread thread : threads) {
      thread.join();
    }
    assertEquals(List.of(), errors);
    assertEquals(8 * 40, accepted.size() + refused.size());
    assertTrue(accepted.size() > 3 && refused.size() > 3, "no contention");

    List<Row> rows = new ArrayList<>(); // the database's record, in commit order
    Map<String, Long> fence = new TreeMap<>();
    try (Connection connection = DriverManager.getConnection(url);
        Statement statement = connection.createStatement()) {
      try (ResultSet r =
          statement.executeQuery("SELECT seq, unit, token FROM accepted ORDER BY seq")) {
        while (r.next()) {
          rows.add(new Row(r.getLong(1), r.getString(2), r.getLong(3)));
        }
      }
      try (ResultSet r =
          statement.executeQuery("SELECT unit, token FROM apportion_fence WHERE scope = 'race'")) {
        while (r.next()) {
          fence.put(r.getString(1), r.getLong(2));
        }
      }
    }
    Comparator<Accepted> order =
        Comparator.comparing(Accepted::unit).thenComparingLong(Accepted::token);
    List<Accepted> stored = new ArrayList<>(rows.stream().map(Row::accepted).toList());
    stored.sort(order);
    List<Accepted> seen = new ArrayList<>(accepted);
    seen.sort(order);
    assertEquals(seen, stored, "every write seen committed is stored once, and nothing else");
    for (String unit : fence.keySet()) {
      List<Long> tokens =
          rows.stream().filter(r -> r.unit().equals(unit)).map(Row::token).toList();
      assertEquals(
          tokens.stream().sorted().toList(), tokens, "unit " + unit + ": tokens in commit order");
      assertEquals(tokens.get(tokens.size() - 1), fence.get(unit));
    }
    for (Refused r : refused) {
      assertTrue(r.current() != null && r.token() < r.current(), r.toString());
      assertTrue(accepted.contains(new Accepted(r.unit(), r.current())), r.toString());
      assertTrue(
          rows.stream()
              .anyMatch(
                  w -> w.unit().equals(r.unit()) && w.token() > r.token() && w.seq() <= r.seen()),
          r + " refused before any higher token committed");
    }
  }

  static long lastSeq(Connection connection) throws SQLException {
    try (Statement statement = connection.createStatement();
        ResultSet r = statement.executeQuery("SELECT n FROM commit_order")) {
      r.next();
      return r.getLong(1);
    }
  }

  // ---------------------------------------------------------------------------------- guards

  @Test
  void ensureSchemaFromManyConnectionsAtOnce() throws Exception {
    String url = server.createDatabase("schema");
    CyclicBarrier start = new CyclicBarrier(8);
    List<Throwable> errors = Collections.synchronizedList(new ArrayList<>());
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < 8; i++) {
      threads.add(
          new Thread(
              () -> {
                try (Connection connection = DriverManager.getConnection(url)) {
                  start.await();
                  new PostgresFence(connection, "s").ensureSchema();
                } catch (Throwable e) {
                  errors.add(e);
                }
              }));
    }
    threads.forEach(Thread::start);
    for (Thread thread : threads) {
      thread.join();
    }
    assertEquals(List.of(), errors);
  }

  @Test
  void aRefusedWriteRunsNothingAndLeavesAutoCommitOn() throws Exception {
    try (Connection connection = DriverManager.getConnection(server.createDatabase("guards"))) {
      String scope = "PartitionSet/shop/orders/6f1c";
      PostgresFence fence = new PostgresFence(connection, scope);
      fence.ensureSchema();
      int result = fence.write("3", 9, db -> 7);
      assertEquals(7, result, "the work's result");
      StaleTokenException refused =
          assertThrows(
              StaleTokenException.class,
              () -> fence.write("3", 8, db -> fail("the work of a refused write ran")));
      assertEquals("3", refused.unit());
      assertEquals(8, refused.token());
      assertEquals(9L, refused.current());
      assertTrue(connection.getAutoCommit());
      assertThrows(
          SQLException.class,
          () ->
              fence.write(
                  "3",
                  10,
                  db -> {
                    execute(db, FAIL);
                    return null;
                  }));
      assertTrue(connection.getAutoCommit());
      JsonNode tokens = contents(connection, "SELECT scope, unit, token FROM " + FENCE);
      assertEquals(9L, tokens.get(scope).get("3").longValue(), "10 rolled back");

      connection.setAutoCommit(false); // an open transaction: the fence would nest in it
      assertThrows(IllegalStateException.class, () -> fence.write("3", 11, db -> null));
      connection.rollback();
    }
  }
}
