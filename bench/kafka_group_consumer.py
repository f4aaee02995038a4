"""A Kafka consumer-group member for bench/bench_kafka.py, run as a process pod as the
PartitionSet's consumers are, so every side of the benchmark starts, stops and restarts its
consumers the same way (a StatefulSet scaled and rolled on the dev-cluster).

It lives in bench/, not in the `apportion` package: it is what apportion is measured against,
and nothing a user installs should carry it.

It writes the lines `python -m apportion.kafka` writes, Unix time first, so one parser reads
every side's pod logs (`set=Group/<group>` where apportion's name the PartitionSet):

    1718000000.123456 acquire unit=3 epoch=0 token=- pod=kc-0 set=Group/bench offset=-1
    1718000000.223456 processed unit=3 offset=57 key=k3 value=k3:12 pod=kc-0
    1718000001.123456 release unit=3 epoch=0 token=- pod=kc-0 set=Group/bench offset=-1

Protocols (`--protocol`):
- eager-roundrobin, eager-sticky: aiokafka, classic protocol, eager (every member gives up
  every partition at each rebalance), round-robin or sticky assignor;
- cooperative-sticky: confluent-kafka (librdkafka), classic protocol, incremental;
- kip848: confluent-kafka, the `consumer` protocol of Kafka 4 (the broker assigns);
- static: cooperative-sticky with `group.instance.id` = the pod's name (KIP-345) and a session
  timeout longer than a restart, so a restarted pod takes its partitions back with no rebalance.

Offsets are auto-committed every second and on revocation and close; the classic protocols
heartbeat every second (KIP-848's interval is the broker's). /healthz on `--port` answers 200
once the consumer has subscribed: the pod is Ready when it can join, as apportion's is when its
worker is up. SIGTERM: close (commit, and leave the group unless static), then exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROTOCOLS = ("eager-roundrobin", "eager-sticky", "cooperative-sticky", "kip848", "static")
HEARTBEAT_MS = 1000
SESSION_MS = 10000
# Longer than a pod's restart on a busy 2-core machine (stop, the StatefulSet's new pod,
# interpreter start): a shorter one lets the broker expire the member and rebalance.
STATIC_SESSION_MS = 15000


class Log:
    """One line per event, flushed: the pod log is read while the pod runs."""

    def __init__(self, pod: str, group: str) -> None:
        self.pod, self.group = pod, group
        self.held: set[int] = set()
        self.lock = threading.Lock()

    def _write(self, line: str) -> None:
        sys.stdout.write(f"{time.time():.6f} {line}\n")
        sys.stdout.flush()

    def ownership(self, action: str, partitions: list[int]) -> None:
        with self.lock:
            for p in sorted(partitions):
                if (action == "acquire") == (p in self.held):
                    continue  # eager assignors repeat what a member keeps: no change
                self._write(
                    f"{action} unit={p} epoch=0 token=- pod={self.pod} "
                    f"set=Group/{self.group} offset=-1"
                )
                (self.held.add if action == "acquire" else self.held.discard)(p)

    def processed(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> None:
        self._write(
            f"processed unit={partition} offset={offset} key={(key or b'').decode()} "
            f"value={(value or b'').decode()} pod={self.pod}"
        )

    def exit(self) -> None:
        """Whatever a client's close did not report as revoked still ends here."""
        self.ownership("release", sorted(self.held))


def serve_health(port: int, ready: threading.Event) -> None:
    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if ready.is_set() and self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((os.environ.get("POD_IP", "0.0.0.0"), port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def run_aiokafka(args: argparse.Namespace, log: Log, ready: threading.Event) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

    assignor = (
        RoundRobinPartitionAssignor
        if args.protocol == "eager-roundrobin"
        else StickyPartitionAssignor
    )

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            log.ownership("release", [tp.partition for tp in revoked])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            log.ownership("acquire", [tp.partition for tp in assigned])

    async def consume() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=args.bootstrap,
            group_id=args.group,
            auto_offset_reset="earliest",
            auto_commit_interval_ms=1000,
            heartbeat_interval_ms=HEARTBEAT_MS,
            session_timeout_ms=SESSION_MS,
            partition_assignment_strategy=(assignor,),
        )
        await consumer.start()
        consumer.subscribe([args.topic], listener=Listener())
        ready.set()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=100)
                for tp, records in batch.items():
                    for record in records:
                        await asyncio.sleep(args.work_time)
                        log.processed(tp.partition, record.offset, record.key, record.value)
        finally:
            await consumer.stop()  # commits and leaves the group

    asyncio.run(consume())


def run_librdkafka(args: argparse.Namespace, log: Log, ready: threading.Event) -> None:
    from confluent_kafka import Consumer, KafkaException

    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.offset.reset": "earliest",
        "auto.commit.interval.ms": 1000,
    }
    if args.protocol == "kip848":
        # Assignor, session and heartbeat are the broker's under this protocol: the client
        # rejects them.
        config["group.protocol"] = "consumer"
    else:
        config["partition.assignment.strategy"] = "cooperative-sticky"
        config["heartbeat.interval.ms"] = HEARTBEAT_MS
        config["session.timeout.ms"] = SESSION_MS
    if args.protocol == "static":
        config["group.instance.id"] = os.environ["POD_NAME"]
        config["session.timeout.ms"] = STATIC_SESSION_MS
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = Consumer(config)

    def revoked(c: Any, parts: list[Any]) -> None:
        # librdkafka's auto-commit does not commit an incremental revocation (90 records of a
        # rolling restart handled twice in a trial): the next owner must resume where this
        # one stopped, as Kafka's docs advise.
        with contextlib.suppress(KafkaException):  # nothing stored since the last commit
            c.commit(asynchronous=False)
        log.ownership("release", [p.partition for p in parts])

    consumer.subscribe(
        [args.topic],
        on_assign=lambda c, parts: log.ownership("acquire", [p.partition for p in parts]),
        on_revoke=revoked,
        on_lost=lambda c, parts: log.ownership("stop", [p.partition for p in parts]),
    )
    ready.set()
    try:
        while not stop.is_set():
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                time.sleep(args.work_time)
                partition, offset = message.partition(), message.offset()
                # Set on every record fetched without an error (None where not applicable).
                assert partition is not None
                assert offset is not None
                log.processed(partition, offset, message.key(), message.value())
    finally:
        consumer.close()  # commits; leaves the group unless static


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=PROTOCOLS, required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--work-time", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    log = Log(os.environ.get("POD_NAME", "-"), args.group)
    ready = threading.Event()
    serve_health(args.port, ready)
    try:
        if args.protocol.startswith("eager"):
            run_aiokafka(args, log, ready)
        else:
            run_librdkafka(args, log, ready)
    finally:
        log.exit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
