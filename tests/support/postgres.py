"""A private PostgreSQL server on loopback, for the fenced-write tests (docs/fencing.md): never
for production.

    with PostgresServer() as server:
        server.dsn()                    # "host=127.0.0.1 port=… user=postgres dbname=postgres"
        server.create_database("case")  # the dsn of a fresh, empty database

    PostgresServer(address="10.244.0.1", clients="10.244.0.0/16")  # reachable from pods

Start: `initdb` into a fresh directory (trust authentication for the superuser `postgres`),
then `pg_ctl start` listening on `address` (127.0.0.1 by default) and a free port only, no Unix
socket; `clients`, a network, is trusted as well (the real node's pods, which reach the host on
its bridge address). PostgreSQL
refuses to run as root, so as root both run as the `postgres` user Debian's package creates
(`runuser`), in a directory under the system's temporary directory that this user owns
(pytest's own temporary directories are private to root). Stop: `pg_ctl stop -m fast`, then
the directory is removed. The binaries are Debian's (/usr/lib/postgresql/<version>/bin, the
newest), else the ones on PATH; when neither exists, scripts/postgres-deps.sh installs them
first, as `make` does. The JUnit suite of clients/java starts its server the same way
(`PostgresServer.java` there).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Final

import psycopg
from psycopg import sql

REPO: Final = Path(__file__).resolve().parents[2]
DEPS: Final = REPO / "scripts" / "postgres-deps.sh"
INITDB: Final = ("-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync")
"""The superuser `postgres`, no password on loopback; C collation, no fsync of the new files."""
SETTINGS: Final = (
    "unix_socket_directories = ''",
    # Durability is not what these tests are about, and the machines running them are slow.
    "fsync = off",
    "max_connections = 100",
)


def find_bindir() -> Path | None:
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    if debian:
        return debian[-1].parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


def bindir() -> Path:
    """The PostgreSQL binaries, installed first if missing (a no-op when present)."""
    found = find_bindir()
    if found is None:
        subprocess.run(["sh", str(DEPS)], check=True)
        found = find_bindir()
    if found is None:
        raise PostgresError(f"no PostgreSQL server binaries (pg_ctl) after {DEPS.name}")
    return found


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


class PostgresError(RuntimeError):
    """The server did not start (the message ends with its log's tail)."""


class PostgresServer:
    def __init__(self, address: str = "127.0.0.1", clients: str | None = None) -> None:
        self.address = address
        self.clients = clients
        self.port = 0
        self.bin = Path()
        self.root: Path | None = None
        self._databases = 0

    @property
    def data(self) -> Path:
        assert self.root is not None, "not started"
        return self.root / "data"

    @property
    def log(self) -> Path:
        assert self.root is not None, "not started"
        return self.root / "server.log"

    def dsn(self, database: str = "postgres") -> str:
        return f"host={self.address} port={self.port} user=postgres dbname={database}"

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=False)

    def start(self) -> None:
        self.bin = bindir()
        self.root = Path(tempfile.mkdtemp(prefix="apportion-postgres-"))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        done = self._run("initdb", "-D", str(self.data), *INITDB)
        if done.returncode:
            self.stop()
            raise PostgresError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        self.port = free_port(self.address)
        with (self.data / "postgresql.conf").open("a") as conf:
            listen = [f"listen_addresses = '{self.address}'", f"port = {self.port}"]
            conf.write("\n".join([*SETTINGS, *listen, ""]))
        if self.clients:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all postgres {self.clients} trust\n")
        done = self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w")
        if done.returncode:
            tail = self.tail()
            self.stop()
            raise PostgresError(f"pg_ctl start failed ({done.returncode}):\n{done.stderr}{tail}")

    def create_database(self, name: str) -> str:
        """The dsn of a new empty database; `name` plus a counter, so names never collide."""
        self._databases += 1
        database = f"{name}_{self._databases}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        return self.dsn(database)

    def tail(self, lines: int = 30) -> str:
        log = self.log
        text = log.read_text(errors="replace") if log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the server (fast: open sessions are ended) and remove its directory."""
        if self.root is None:
            return
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w")
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
