package dev.apportion.client.fencing;

import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Optional;
import java.util.stream.Stream;

/**
 * A private PostgreSQL server on loopback for the tests, started as tests/support/postgres.py
 * starts the Python suite's: {@code initdb} into a fresh directory (trust authentication for
 * the superuser {@code postgres}), {@code pg_ctl start} on 127.0.0.1 and a free port only, no
 * Unix socket; as root (PostgreSQL refuses to run as root) both run as the {@code postgres}
 * user through {@code runuser}, in a directory that user owns. Binaries: Debian's newest
 * /usr/lib/postgresql/N/bin, else pg_ctl on PATH; scripts/postgres-deps.sh installs them ({@code
 * make java} runs it first).
 */
final class PostgresServer implements AutoCloseable {
  private static final List<String> SETTINGS =
      List.of(
          "listen_addresses = '127.0.0.1'",
          "unix_socket_directories = ''",
          "fsync = off", // durability is not under test, and test machines are slow
          "max_connections = 100");

  private final Path bin;
  private final Path root;
  private final boolean asPostgres;
  private final int port;
  private int databases;

  private PostgresServer(Path bin, Path root, boolean asPostgres, int port) {
    this.bin = bin;
    this.root = root;
    this.asPostgres = asPostgres;
    this.port = port;
  }

  static PostgresServer start() throws IOException, InterruptedException {
    Path bin =
        binDir()
            .orElseThrow(
                () ->
                    new IllegalStateException(
                        "no PostgreSQL server binaries (pg_ctl): run sh scripts/postgres-deps.sh"));
    boolean root = (Integer) Files.getAttribute(Path.of("/proc/self"), "unix:uid") == 0;
    Path dir = Files.createTempDirectory("apportion-postgres-");
    if (root) {
      var users = dir.getFileSystem().getUserPrincipalLookupService();
      Files.setOwner(dir, users.lookupPrincipalByName("postgres"));
    }
    PostgresServer server = new PostgresServer(bin, dir, root, freePort());
    try {
      server.run(
          "initdb", "-D", server.data().toString(), "-U", "postgres", "--auth=trust",
          "--encoding=UTF8", "--no-locale", "--no-sync");
      List<String> conf = new ArrayList<>(SETTINGS);
      conf.add("port = " + server.port);
      Files.writeString(
          server.data().resolve("postgresql.conf"),
          "\n" + String.join("\n", conf) + "\n",
          StandardOpenOption.APPEND);
      server.run("pg_ctl", "start", "-D", server.data().toString(), "-l",
          dir.resolve("server.log").toString(), "-w");
    } catch (Exception e) {
      try {
        server.close();
      } catch (Exception closing) {
        e.addSuppressed(closing);
      }
      throw e;
    }
    return server;
  }

  static Optional<Path> binDir() {
    try (Stream<Path> versions = Files.list(Path.of("/usr/lib/postgresql"))) {
      Optional<Path> debian =
          versions
              .filter(v -> v.getFileName().toString().matches("\\d+"))
              .max(Comparator.comparingInt(v -> Integer.parseInt(v.getFileName().toString())))
              .map(v -> v.resolve("bin"))
              .filter(b -> Files.isExecutable(b.resolve("pg_ctl")));
      if (debian.isPresent()) {
        return debian;
      }
    } catch (IOException e) {
      // no Debian layout: look on PATH
    }
    return Stream.of(System.getenv().getOrDefault("PATH", "").split(":"))
        .map(Path::of)
        .filter(d -> Files.isExecutable(d.resolve("pg_ctl")))
        .findFirst();
  }

  static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0, 1, InetAddress.getLoopbackAddress())) {
      return socket.getLocalPort();
    }
  }

  Path data() {
    return root.resolve("data");
  }

  String url(String database) {
    return "jdbc:postgresql://127.0.0.1:" + port + "/" + database + "?user=postgres";
  }

  /** The JDBC URL of a new empty database: {@code name} plus a counter, never colliding. */
  synchronized String createDatabase(String name) throws SQLException {
    String database = name + "_" + ++databases;
    try (Connection c = DriverManager.getConnection(url("postgres"));
        Statement statement = c.createStatement()) {
      statement.execute("CREATE DATABASE \"" + database + "\"");
    }
    return url(database);
  }

  private void run(String... command) throws IOException, InterruptedException {
    List<String> line = new ArrayList<>();
    if (asPostgres) {
      line.addAll(List.of("runuser", "-u", "postgres", "--"));
    }
    line.add(bin.resolve(command[0]).toString());
    line.addAll(List.of(command).subList(1, command.length));
    Process process = new ProcessBuilder(line).redirectErrorStream(true).start();
    String output = new String(process.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    if (process.waitFor() != 0) {
      throw new IllegalStateException(String.join(" ", line) + " failed:\n" + output + log());
    }
  }

  private String log() throws IOException {
    Path log = root.resolve("server.log");
    return Files.exists(log) ? Files.readString(log) : "";
  }

  /** Stops the server (fast: open sessions are ended) and removes its directory. */
  @Override
  public void close() throws IOException, InterruptedException {
    try {
      if (Files.exists(data().resolve("postmaster.pid"))) {
        run("pg_ctl", "stop", "-D", data().toString(), "-m", "fast", "-w");
      }
    } finally {
      try (Stream<Path> files = Files.walk(root)) {
        for (Path path : files.sorted(Comparator.reverseOrder()).toList()) {
          Files.delete(path);
        }
      }
    }
  }
}
