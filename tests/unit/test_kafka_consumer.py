"""The Python consumer's hand-off bookkeeping without a broker: a release commits only while the
lease holds and the newest table still names this pod the partition's owner under its token,
and otherwise says `stop` (tests/e2e/test_kafka.py runs the whole consumer on a broker)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from apportion.kafka import ConsumerListener
from apportion.kafka._consumer import PartitionConsumer
from apportion.worker import Worker


class _Kafka:
    """The calls the consuming loop makes on `AIOKafkaConsumer`, recording commits."""

    def __init__(self) -> None:
        self.commits: list[dict] = []

    async def commit(self, offsets: dict) -> None:
        self.commits.append(offsets)

    def assign(self, partitions: list) -> None:
        pass

    def seek(self, tp: object, offset: int) -> None:
        pass


def _consumer(
    lease_holds: bool, owner: str, listener: ConsumerListener | None = None
) -> tuple[PartitionConsumer, _Kafka]:
    consumer = PartitionConsumer(
        "orders",
        lambda record: asyncio.sleep(0),
        set_name="orders",
        bootstrap_servers="127.0.0.1:1",
        group_id="orders",
        worker_options={"namespace": "ns", "pod_name": "c-0"},
        listener=listener,
    )
    kafka = _Kafka()
    consumer._consumer = kafka
    consumer.worker.token = lambda unit: 4  # type: ignore[method-assign]
    consumer.worker.lease_holds = lambda unit=None: lease_holds  # type: ignore[method-assign]
    table = SimpleNamespace(
        units={"3": SimpleNamespace(owner=owner, epoch=4 if owner == "c-0" else 9)}
    )
    consumer.worker.__class__ = type("_Worker", (Worker,), {"table": table, "epoch": 9})
    consumer.positions, consumer.committed = {3: 120}, {3: 100}
    consumer._tokens[3] = 4
    return consumer, kafka


async def release(consumer: PartitionConsumer) -> None:
    async def loop() -> None:  # the consuming loop's part that applies changes
        while True:
            await consumer._run(await consumer._changes.get())

    consumer._loop_task = asyncio.create_task(loop())
    try:
        await consumer._on_release(frozenset({"3"}), 9)
    finally:
        consumer._loop_task.cancel()


@pytest.mark.parametrize(
    ("lease_holds", "owner"),
    [
        (True, "c-0"),
        # Cut off past its own deadline: the partition may be someone else's already.
        (False, "c-0"),
        # Seen after the cut was lifted: the lease holds again, but a newer table (read with
        # the confirmation) gave the partition to c-1 when the hand-off timed out. The e2e cut
        # test found the Java consumer's release going through here.
        (True, "c-1"),
    ],
)
async def test_a_release_commits_only_within_its_lease_and_ownership(
    lease_holds: bool, owner: str, caplog: pytest.LogCaptureFixture
) -> None:
    consumer, kafka = _consumer(lease_holds, owner)
    with caplog.at_level(logging.INFO, logger="apportion.kafka"):
        await release(consumer)
    if lease_holds and owner == "c-0":
        assert [{tp.partition: o for tp, (o, _) in c.items()} for c in kafka.commits] == [{3: 120}]
        assert "release unit=3 epoch=9 token=4 pod=c-0 set=PartitionSet/orders offset=120" in (
            caplog.text
        )
    else:
        # Nothing committed over the new owner's offsets, and the line does not present the
        # offset committed before (100) as this release's commit.
        assert kafka.commits == []
        assert "stop unit=3 epoch=9 token=4 pod=c-0 set=PartitionSet/orders offset=120" in (
            caplog.text
        )
        assert "release unit=3" not in caplog.text


class Recorder(ConsumerListener):
    def __init__(self, fail: bool = False) -> None:
        self.told: list[tuple] = []
        self.fail = fail

    def ownership(self, action, partition, epoch, token, offset) -> None:
        self.told.append((action, partition, epoch, token, offset))
        if self.fail:
            raise RuntimeError("a listener bug")

    def committed(self, partition, epoch, token, offset) -> None:
        self.told.append(("committed", partition, token, offset))


@pytest.mark.parametrize("owner", ["c-0", "c-1"])
async def test_the_listener_hears_the_commit_and_the_release_or_the_stop(owner: str) -> None:
    """As the Java consumer's Listener: the commit of a release, then the release with the
    committed offset; a partition that was given away meanwhile is a stop with no commit."""
    listener = Recorder()
    consumer, _ = _consumer(True, owner, listener)
    await release(consumer)
    if owner == "c-0":
        assert listener.told == [("committed", 3, 4, 120), ("release", 3, 9, 4, 120)]
    else:
        assert listener.told == [("stop", 3, 9, 4, 120)]


async def test_a_failing_listener_does_not_stop_the_release(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer, kafka = _consumer(True, "c-0", Recorder(fail=True))
    with caplog.at_level(logging.INFO, logger="apportion.kafka"):
        await release(consumer)
    assert len(kafka.commits) == 1
    assert "release unit=3 epoch=9" in caplog.text
    assert "listener failed" in caplog.text
