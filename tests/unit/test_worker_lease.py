"""The serving lease in the `Worker` (docs/handoff.md, "Cut off or paused"): against an
in-memory API server that can be cut off, and a clock that can jump as a paused (SIGSTOPped,
frozen, migrated) process sees it jump. The worker serves nothing once the lease ran out, says so
(on_suspend, /metrics, /readyz), releases and revokes nothing because of it, and serves again
only after a fresh confirmation, re-reading the table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from lightkube.resources.core_v1 import ConfigMap, Pod

from apportion.api.assignment import AssignmentTable
from apportion.api.worker_report import WorkerReport
from apportion.worker._lease import boot_clock
from apportion.worker._worker import Hooks, Worker, WorkerOptions
from tests.unit.test_worker_release import ME, OTHER, REF, FakeApi, leaving, mine, serving, theirs

LEASE = 0.4  # seconds: confirmations every 0.1 s


def table(epoch: int, units: dict, lease: float | None = LEASE) -> AssignmentTable:
    return AssignmentTable(REF, 1, "netherite", 4, epoch, (ME, OTHER), units, serving_lease=lease)


class CutOffApi(FakeApi):
    """FakeApi whose root ConfigMap can be read with GET, and which can be cut off: then every
    read hangs (packets dropped), as behind an iptables DROP."""

    def __init__(self, first: AssignmentTable) -> None:
        super().__init__(first)
        self.reachable = asyncio.Event()
        self.reachable.set()
        self.gets = 0

    async def get(self, res: type, name: str, *, namespace: str) -> Any:
        if res is Pod:
            return await super().get(res, name, namespace=namespace)
        assert res is ConfigMap
        await self.reachable.wait()
        self.gets += 1
        if name != self.root.metadata.name:  # type: ignore[union-attr]
            raise ApiError(status=Status(code=404, reason="NotFound"))
        return self.root


class Clock:
    """The boot clock plus jumps: what a process sees after being paused."""

    def __init__(self) -> None:
        self.jumped = 0.0

    def __call__(self) -> float:
        return boot_clock() + self.jumped


class Record:
    """Records callbacks; a release finishes only once `finish` is set (in-flight work)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, frozenset[str]]] = []
        self.finish = asyncio.Event()
        self.finish.set()

    def callback(self, kind: str) -> Any:
        async def record(units: frozenset[str], epoch: int) -> None:
            self.calls.append((kind, units))
            if kind == "release":
                await self.finish.wait()

        record.__name__ = f"on_{kind}"
        return record

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


async def started(api: CutOffApi, record: Record, clock: Clock) -> Worker:
    worker = Worker(
        "PartitionSet",
        "orders",
        Hooks(
            on_acquire=record.callback("acquire"),
            on_release=record.callback("release"),
            on_revoke=record.callback("revoke"),
            on_suspend=record.callback("suspend"),
            on_resume=record.callback("resume"),
        ),
        options=WorkerOptions(handle_signals=False),
        namespace="ns",
        pod_name=ME.name,
        client=api,  # type: ignore[arg-type]
    )
    worker._lease.clock = clock
    await serving(api, worker)
    await worker.wait_for(lambda: worker.my_units() == {"0", "1"}, 5)
    return worker


FIRST = table(1, {"0": mine(1), "1": mine(1)})


def serving_metric(worker: Worker) -> tuple[int, int]:
    page = WorkerReport.parse(worker.metrics().render())
    return page.serving["orders"], page.lease_expiries["orders"]


async def eventually(condition: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_cut_off_worker_stops_serving_and_resumes_after_a_fresh_confirmation() -> None:
    api, record, clock = CutOffApi(FIRST), Record(), Clock()
    worker = await started(api, record, clock)
    try:
        assert worker.serving
        assert worker.owns("0")
        assert worker.token("0") == 1
        await eventually(lambda: api.gets >= 3)  # confirming every quarter lease
        api.reachable.clear()
        await eventually(lambda: not worker.serving)
        assert not worker.owns("0")
        assert worker.my_units() == frozenset()
        assert not worker.lease_holds("0")
        assert worker.token("0") == 1
        await eventually(lambda: "suspend" in record.kinds())
        assert record.calls[-1] == ("suspend", frozenset({"0", "1"}))
        assert serving_metric(worker) == (0, 1)
        # Nothing is released, revoked or acknowledged because of the outage.
        acks = len(api.acks)
        assert [k for k in record.kinds() if k in ("release", "revoke")] == []
        api.reachable.set()
        await eventually(lambda: worker.serving)
        assert worker.owns("0")
        assert worker.owns("1")
        await eventually(lambda: "resume" in record.kinds())
        assert record.calls[-1] == ("resume", frozenset({"0", "1"}))
        assert serving_metric(worker) == (1, 1)
        # One ack, for the operator's report: the same epoch, nothing released or pending.
        await eventually(lambda: len(api.acks) == acks + 1)
        ack = api.acks[-1]
        assert (ack.epoch, ack.pending, ack.suspended and ack.suspended.count) == (1, set(), 1)
    finally:
        await worker.close()


async def test_a_paused_worker_serves_nothing_before_it_has_reconfirmed() -> None:
    """The clock jumps past the lease, as after a SIGSTOP longer than it: the very next check
    refuses, whatever the (stale) table says, until a confirmation sent after the pause."""
    api, record, clock = CutOffApi(FIRST), Record(), Clock()
    worker = await started(api, record, clock)
    try:
        api.reachable.clear()  # the confirmation after the pause cannot get through yet
        clock.jumped += 10 * LEASE
        assert not worker.owns("0")
        assert not worker.serving
        api.publish(table(2, {"0": theirs(2), "1": mine(1)}))  # what happened meanwhile
        api.reachable.set()
        await eventually(lambda: worker.serving)
        assert not worker.owns("0")
        assert worker.owns("1")
        # The ack tells how long it served nothing: the pause less the lease it had left.
        await eventually(lambda: any(a.suspended for a in api.acks))
        suspended = next(a.suspended for a in api.acks if a.suspended)
        assert suspended.count == 1
        assert 9 * LEASE <= suspended.last_seconds < 11 * LEASE
    finally:
        await worker.close()


async def test_a_release_is_finished_only_until_the_lease_before_it_ends() -> None:
    """A worker that sees a release keeps confirming, yet may finish the releasing unit only
    until its last confirmation before the release, plus the lease: the operator's timeout
    began at the release."""
    # A lease long enough that the real clock, on a loaded machine, does not end it between
    # the checks below: the test ends it with its own clock.
    lease = 3.0
    api, record, clock = CutOffApi(table(1, {"0": mine(1), "1": mine(1)}, lease)), Record(), Clock()
    record.finish.clear()
    worker = await started(api, record, clock)
    try:
        await eventually(lambda: api.gets >= 2)
        # The operator's timeout starts when it publishes the release: every confirmation that
        # may count was sent before then (one still in flight at publishing may land after it).
        timeout_ends = clock() + lease
        api.publish(table(2, {"0": mine(1), "1": leaving(1, 2)}, lease))
        await eventually(lambda: worker.epoch == 2)
        deadline = worker.serving_deadline("1")
        assert deadline is not None
        assert deadline < timeout_ends
        await eventually(lambda: (worker.serving_deadline() or 0) > timeout_ends)  # confirmed on
        assert worker.serving_deadline("1") == deadline  # confirming the release extends nothing
        assert worker.serving
        assert worker.owns("0")
        assert worker.lease_holds("1")
        clock.jumped += deadline - clock() + 0.001
        assert not worker.lease_holds("1")  # its time is up, while unit 0 is still served
        assert worker.token("1") == 1  # still held: the release has not finished
        assert worker.owns("0")
    finally:
        record.finish.set()
        await worker.close()


async def test_without_a_lease_in_the_table_a_cut_off_worker_keeps_serving() -> None:
    api, record, clock = (
        CutOffApi(table(1, {"0": mine(1), "1": mine(1)}, lease=None)),
        Record(),
        Clock(),
    )
    worker = await started(api, record, clock)
    try:
        api.reachable.clear()
        clock.jumped += 1000.0
        await asyncio.sleep(0.2)
        assert worker.serving
        assert worker.owns("0")
        assert worker.serving_deadline() is None
        assert api.gets == 0  # KeepServing confirms nothing: no load on the API server
    finally:
        await worker.close()


@pytest.mark.parametrize("status", [200, 503])
async def test_readyz_tells_whether_the_worker_serves(status: int) -> None:
    from aiohttp import ClientSession

    from apportion_dev.devcluster.net import free_port

    api, clock = CutOffApi(FIRST), Clock()
    port = free_port()
    worker = Worker(
        "PartitionSet",
        "orders",
        options=WorkerOptions(port=port, host="127.0.0.1", handle_signals=False),
        namespace="ns",
        pod_name=ME.name,
        client=api,  # type: ignore[arg-type]
    )
    worker._lease.clock = clock
    await serving(api, worker)
    try:
        await worker.wait_for(lambda: worker.serving and worker.my_units() == {"0", "1"}, 5)
        if status == 503:
            api.reachable.clear()
            clock.jumped += 10 * LEASE
        async with (
            ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/readyz") as answer,
        ):
            assert answer.status == status
    finally:
        await worker.close()
