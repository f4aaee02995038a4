"""A single-node Kafka broker (KRaft, broker and controller in one JVM) on loopback, run from
the jars `fetch-jars.sh` caches: for tests and benchmarks, never for production.

    with KafkaBroker(tmp_path) as broker:
        broker.bootstrap            # "127.0.0.1:<port>"

Start: `StorageTool random-uuid`, `StorageTool format`, then `kafka.Kafka server.properties`,
on two free loopback ports (clients, controller); ready once the broker logs that it started
and its client port accepts connections. Stop: SIGTERM (a controlled shutdown), SIGKILL after
`stop_timeout`. Run alone (`python integrations/kafka/kafka_broker.py DIR`) it prints its
bootstrap address and serves until SIGINT (Ctrl-C) or SIGTERM, either of which stops the JVM.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Final

HERE = Path(__file__).resolve().parent
FETCH: Final = HERE / "fetch-jars.sh"
STARTED: Final = "Kafka Server started"
JVM_OPTIONS: Final = ("-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
"""Small heap and the serial collector: the machines running tests have two cores."""


def kafka_version() -> str:
    match = re.search(r"<kafka.version>(.+)</kafka.version>", (HERE / "pom.xml").read_text())
    assert match, "pom.xml names no kafka.version"
    return match[1]


def jar_dir() -> Path:
    """Where fetch-jars.sh puts the jars ($APPORTION_KAFKA_HOME, else the user cache)."""
    home = os.environ.get("APPORTION_KAFKA_HOME")
    base = Path(home) if home else Path.home() / ".cache/apportion/kafka" / kafka_version()
    return base / "lib"


def fetch_jars() -> Path:
    """The jar directory, fetched with Maven first if needed (cached, a no-op afterwards)."""
    subprocess.run(["sh", str(FETCH)], check=True)
    return jar_dir()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerError(RuntimeError):
    """The broker did not start (the message ends with its log's tail)."""


class KafkaBroker:
    """One broker+controller process whose data and log live under `workdir`; `overrides`
    are broker properties set on top of (or instead of) the ones below."""

    def __init__(
        self,
        workdir: Path,
        *,
        overrides: Mapping[str, str] | None = None,
        stop_timeout: float = 30.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.overrides = dict(overrides or {})
        self.stop_timeout = stop_timeout
        self.port = 0
        self.controller_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.workdir / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _java(self, *args: str) -> list[str]:
        return ["java", *JVM_OPTIONS, "-cp", f"{fetch_jars()}/*", *args]

    def properties(self) -> str:
        c = self.controller_port
        return "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{c}",
                f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{c}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                f"log.dirs={self.workdir / 'data'}",
                "auto.create.topics.enable=false",
                # One node: every internal topic has one replica, and few partitions start fast.
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=4",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                # Groups form at once instead of waiting 3 s for more members.
                "group.initial.rebalance.delay.ms=0",
                *(f"{key}={value}" for key, value in self.overrides.items()),
                "",
            ]
        )

    def start(self, timeout: float = 90.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, self.controller_port = free_port(), free_port()
        config = self.workdir / "server.properties"
        config.write_text(self.properties())
        cluster_id = subprocess.run(
            self._java("kafka.tools.StorageTool", "random-uuid"),
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()[-1]
        subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)),
            check=True,
            capture_output=True,
        )
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)), stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None:
                raise BrokerError(f"the broker exited ({self.process.returncode}):\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"the broker did not start in {timeout:.0f}s:\n{self.tail()}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        if STARTED not in self.log.read_text(errors="replace"):
            return False
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> int | None:
        """Stop the broker (controlled shutdown); its exit status, None if never started."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _exit(signum: int, _: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "kafka-broker")
    # Both stop the broker (the `with` below shuts the JVM down), also when started in the
    # background, where a shell starts it with SIGINT ignored and Python keeps it that way.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _exit)
    with KafkaBroker(workdir) as broker:
        # Flushed: with the output redirected to a file, nothing would appear until exit.
        print(
            f"Kafka {kafka_version()} on {broker.bootstrap} (log {broker.log}); Ctrl-C stops it",
            flush=True,
        )
        while True:
            signal.pause()


if __name__ == "__main__":
    main()
