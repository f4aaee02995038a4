"""Helpers of the Kafka end-to-end test and benchmark: topics, a numbered-message producer in a
thread, the consumer processes of pods, and the `processed`/`commit` lines of
`python -m apportion.kafka` (docs/kafka.md)."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, str]]:
    """partition -> (offset, metadata) the broker holds for `group` on `topic`: what was
    committed last, whoever wrote it (the metadata names the writer's token)."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def fetch() -> dict[int, tuple[int, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            found = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        return {
            tp.partition: (m.offset, m.metadata) for tp, m in found.items() if tp.topic == topic
        }

    return asyncio.run(fetch())


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(create())


@dataclass(frozen=True)
class Produced:
    key: str
    seq: int
    partition: int
    offset: int
    time: float


class Producer(threading.Thread):
    """Sends `k<i>:<seq>` for keys k0..k<keys-1> every `period` seconds until stopped; key i
    goes to partition i % partitions, so every partition gets traffic. `produced` holds what
    the broker acknowledged, with the (Unix) time it did."""

    def __init__(
        self, bootstrap: str, topic: str, *, keys: int, partitions: int, period: float = 0.1
    ) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.keys, self.partitions, self.period = keys, partitions, period
        self.produced: list[Produced] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> list[Produced]:
        self._halt.set()
        self.join(60)
        if self.error is not None:
            raise self.error
        return self.produced

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as error:
            self.error = error

    async def _produce(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await producer.start()
        try:
            seq = 0
            while not self._halt.is_set():
                sent = []
                for i in range(self.keys):
                    key = f"k{i}"
                    future = await producer.send(
                        self.topic,
                        f"{key}:{seq}".encode(),
                        key=key.encode(),
                        partition=i % self.partitions,
                    )
                    sent.append((key, future))
                for key, future in sent:
                    meta = await future
                    self.produced.append(
                        Produced(key, seq, meta.partition, meta.offset, time.time())
                    )
                seq += 1
                await asyncio.sleep(self.period)
        finally:
            await producer.stop()


@dataclass(frozen=True)
class Processed:
    time: float
    pod: str
    partition: int
    offset: int
    key: str
    value: str


@dataclass(frozen=True)
class Commit:
    time: float
    pod: str
    partition: int
    offset: int


_PROCESSED = re.compile(
    r"^(?P<time>\d+\.\d+) processed unit=(?P<unit>\d+) offset=(?P<offset>\d+) "
    r"key=(?P<key>\S*) value=(?P<value>\S*) pod=(?P<pod>\S+)"
)
_OFFSET = re.compile(
    r"^(?P<time>\d+\.\d+) (?P<action>commit|release) unit=(?P<unit>\d+) "
    r".*\bpod=(?P<pod>\S+) .*\boffset=(?P<offset>\d+)"
)


def _lines(dev_cluster: Any, namespace: str, pods: list[str]) -> list[str]:
    lines = []
    for pod in pods:
        path = dev_cluster.pod_log_path(namespace, pod)
        if os.path.exists(path):
            lines += Path(path).read_text(errors="replace").splitlines()
    return lines


def processed(dev_cluster: Any, namespace: str, pods: list[str]) -> list[Processed]:
    found = []
    for line in _lines(dev_cluster, namespace, pods):
        if m := _PROCESSED.match(line):
            found.append(
                Processed(
                    float(m["time"]),
                    m["pod"],
                    int(m["unit"]),
                    int(m["offset"]),
                    m["key"],
                    m["value"],
                )
            )
    return sorted(found, key=lambda p: p.time)


def commits(dev_cluster: Any, namespace: str, pods: list[str]) -> list[Commit]:
    """Offsets committed, from `commit` lines and from `release` lines (a release commits)."""
    found = []
    for line in _lines(dev_cluster, namespace, pods):
        if m := _OFFSET.match(line):
            found.append(Commit(float(m["time"]), m["pod"], int(m["unit"]), int(m["offset"])))
    return sorted(found, key=lambda c: c.time)


def consumer_pid(namespace: str, pod: str) -> int | None:
    """The pid of the pod's `python -m apportion.kafka` process (pod simulator), from /proc."""
    wanted = {f"POD_NAME={pod}".encode(), f"POD_NAMESPACE={namespace}".encode()}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"apportion.kafka" not in cmdline:
                continue
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            return int(entry.name)
    return None
