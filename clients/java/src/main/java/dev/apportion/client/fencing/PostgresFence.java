package dev.apportion.client.fencing;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Objects;

/**
 * Fenced writes to PostgreSQL over plain JDBC (docs/fencing.md), the twin of Python's
 * apportion.fencing.Fence: a write for unit {@code u} under fencing token {@code t} commits only
 * if no write for {@code u} under a higher token has been accepted. A worker that lost {@code
 * u} (paused, cut off from the API server, force-deleted) keeps its old token, the new owner
 * writes under a higher one, and from the new owner's first write on the database itself
 * refuses every write of the old one.
 *
 * <pre>{@code
 * PostgresFence fence = new PostgresFence(connection, "PartitionSet/shop/orders/" + setUid);
 * fence.ensureSchema();
 * fence.write(unit, worker.token(unit), c -> {     // StaleTokenException: the unit moved on
 *   try (PreparedStatement update = c.prepareStatement("UPDATE orders SET ... WHERE unit = ?")) {
 *     update.setString(1, unit);
 *     return update.executeUpdate();
 *   }
 * });
 * }</pre>
 *
 * <p>{@link #write} opens a transaction whose first statement is one atomic upsert of the
 * unit's row in {@code apportion_fence}, raising the token only if it does not go down.
 * Accepted, the row stays locked until the transaction ends, so the work's statements commit
 * together with the token and every competing writer of the unit waits: no read-modify-write
 * race. Refused, the work never runs and nothing commits. The connection must be in auto-commit
 * mode (no transaction open: statements run before the fence would commit with it, unfenced);
 * it is again afterwards. Like its connection, a fence serves one thread at a time.
 *
 * <p>Only {@code java.sql}: any PostgreSQL JDBC driver on the application's classpath does.
 * Tokens are comparable within one set incarnation only (a recreated set starts its epochs
 * over): put the set's uid in the scope.
 */
public final class PostgresFence {
  static final String SCHEMA =
      "CREATE TABLE IF NOT EXISTS apportion_fence (scope text NOT NULL, unit text NOT NULL,"
          + " token bigint NOT NULL, PRIMARY KEY (scope, unit))";
  /**
   * Serializes {@link #ensureSchema} across processes: two concurrent CREATE TABLE IF NOT EXISTS
   * of one table can both miss it, and one then fails on the catalog's unique index. The key
   * is "apport" in ASCII, as in the Python client.
   */
  static final String SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(107135550583412)";

  static final String ADVANCE =
      "INSERT INTO apportion_fence (scope, unit, token) VALUES (?, ?, ?)"
          + " ON CONFLICT (scope, unit) DO UPDATE SET token = EXCLUDED.token"
          + " WHERE apportion_fence.token <= EXCLUDED.token RETURNING token";
  static final String CURRENT = "SELECT token FROM apportion_fence WHERE scope = ? AND unit = ?";

  /** The application's statements of one fenced write, run in its transaction. */
  @FunctionalInterface
  public interface Work<T> {
    T run(Connection connection) throws SQLException;
  }

  @FunctionalInterface
  private interface Body<T, E extends Exception> {
    T run() throws SQLException, E;
  }

  private final Connection connection;
  private final String scope;

  /**
   * Fenced writes on {@code connection} for the units of {@code scope}: any text naming one
   * token space, e.g. {@code "PartitionSet/shop/orders/<set uid>"}; several sets share the
   * table under their own scopes.
   */
  public PostgresFence(Connection connection, String scope) {
    this.connection = Objects.requireNonNull(connection, "connection");
    this.scope = Objects.requireNonNull(scope, "scope");
  }

  /** Creates {@code apportion_fence} if missing; safe from many processes at once. */
  public void ensureSchema() throws SQLException {
    transaction(
        () -> {
          try (Statement statement = connection.createStatement()) {
            statement.execute(SCHEMA_LOCK);
            statement.execute(SCHEMA);
          }
          return null;
        });
  }

  /**
   * Runs {@code work} in a transaction fenced by {@code token} for {@code unit} and returns its
   * result: throws {@link StaleTokenException} before {@code work} runs when a higher token was
   * accepted, commits the token with the work's statements when it returns, rolls both back
   * when it throws. ({@code worker.token(unit)} is null for a unit not held: unboxing it here
   * throws before anything is written.)
   */
  public <T> T write(String unit, long token, Work<T> work)
      throws SQLException, StaleTokenException {
    Objects.requireNonNull(unit, "unit");
    Objects.requireNonNull(work, "work");
    return transaction(
        () -> {
          try (PreparedStatement advance = connection.prepareStatement(ADVANCE)) {
            advance.setString(1, scope);
            advance.setString(2, unit);
            advance.setLong(3, token);
            try (ResultSet accepted = advance.executeQuery()) {
              if (!accepted.next()) {
                throw new StaleTokenException(unit, token, current(unit));
              }
            }
          }
          return work.run(connection);
        });
  }

  private Long current(String unit) throws SQLException {
    try (PreparedStatement select = connection.prepareStatement(CURRENT)) {
      select.setString(1, scope);
      select.setString(2, unit);
      try (ResultSet row = select.executeQuery()) {
        return row.next() ? row.getLong(1) : null;
      }
    }
  }

  private <T, E extends Exception> T transaction(Body<T, E> body) throws SQLException, E {
    if (!connection.getAutoCommit()) {
      throw new IllegalStateException(
          "a fenced write opens its own transaction: pass a connection in auto-commit mode");
    }
    connection.setAutoCommit(false);
    T result;
    try {
      result = body.run();
      connection.commit();
    } catch (Throwable failure) {
      try {
        connection.rollback();
        connection.setAutoCommit(true);
      } catch (SQLException e) {
        failure.addSuppressed(e);
      }
      throw failure;
    }
    connection.setAutoCommit(true);
    return result;
  }
}
