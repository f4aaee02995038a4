"""A release is acknowledged only once `on_release` returned: the `Worker` against an in-memory
stand-in for the API server, with release callbacks that raise, always raise or hang (the normal
path runs against a real API server in tests/e2e/test_worker.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube.resources.core_v1 import ConfigMap, Pod

from apportion.api.assignment import (
    Ack,
    AssignmentTable,
    Incarnation,
    Release,
    ResourceRef,
    UnitState,
    assignment_config_map,
    encode_assignment,
)
from apportion.api.worker_report import RELEASE_FAILURES, WorkerReport
from apportion.publishing.client import decode
from apportion.worker import _worker as worker_module
from apportion.worker._worker import Hooks, Worker, WorkerOptions
from tests.unit.fake_apiserver import FakeApiServer

REF = ResourceRef("PartitionSet", "ns", "orders", "set-uid")
ME = Incarnation("w-0", "uid-0")
OTHER = Incarnation("w-1", "uid-1")
ROOT = assignment_config_map("PartitionSet", "orders")
ACK_KEY = REF.ack_annotation


def table(epoch: int, units: dict[str, UnitState]) -> AssignmentTable:
    return AssignmentTable(REF, 1, "netherite", 4, epoch, (ME, OTHER), units)


def mine(epoch: int) -> UnitState:
    return UnitState(ME.name, epoch)


def leaving(epoch: int, since: int) -> UnitState:
    """Owned by me under token `epoch`, releasing to the other pod since epoch `since`."""
    return UnitState(ME.name, epoch, Release(OTHER.name, 100.0, since))


def theirs(epoch: int) -> UnitState:
    return UnitState(OTHER.name, epoch)


class FakeApi:
    """The calls `Worker` makes: its Pod's GET and merge patches (the acks) here, the root
    ConfigMap's list and watch (tables published with `publish`) through a scripted API server
    on loopback (`serve`), which the watch primitive speaks HTTP to."""

    def __init__(self, first: AssignmentTable) -> None:
        self.server = FakeApiServer()
        self.acks: list[Ack] = []
        self.publish(first)

    async def serve(self) -> None:
        await self.server.start()
        self._http = self.server.client()
        self._client = self._http._client  # what `apportion.listwatch` sends its requests with

    async def stop_serving(self) -> None:
        await self._http.close()
        await self.server.stop()

    def publish(self, t: AssignmentTable) -> None:
        [part] = encode_assignment(t)
        self.server.put("configmaps", "ns", ROOT, **part.body())

    @property
    def root(self) -> ConfigMap:
        return decode(ConfigMap, self.server.objects[("configmaps", "ns", ROOT)])

    async def get(self, res: type, name: str, *, namespace: str) -> Any:
        assert res is Pod
        assert name == ME.name
        return Pod.from_dict(
            {
                "metadata": {"name": name, "namespace": namespace, "uid": ME.uid},
                "spec": {"containers": [], "terminationGracePeriodSeconds": 30},
            }
        )

    async def patch(self, res: type, name: str, body: dict[str, Any], **_: Any) -> None:
        assert body["metadata"]["uid"] == ME.uid
        self.acks.append(Ack.from_annotation(body["metadata"]["annotations"][ACK_KEY]))

    async def close(self) -> None:
        pass


class Callbacks:
    """Records every call; `on_release` raises its first `failures` calls (all of them when
    None), or hangs while `hang` is set."""

    def __init__(self, failures: int | None = 0, hang: bool = False) -> None:
        self.failures = failures
        self.hang = hang
        self.calls: list[tuple[str, frozenset[str], int]] = []
        self.released = asyncio.Event()

    async def on_acquire(self, units: frozenset[str], epoch: int) -> None:
        self.calls.append(("acquire", units, epoch))

    async def on_release(self, units: frozenset[str], epoch: int) -> None:
        self.calls.append(("release", units, epoch))
        if self.hang:
            await asyncio.Event().wait()
        if self.failures is None or self.releases() <= self.failures:
            raise RuntimeError("storage unavailable")
        self.released.set()

    async def on_revoke(self, units: frozenset[str], epoch: int) -> None:
        self.calls.append(("revoke", units, epoch))

    def releases(self) -> int:
        return sum(1 for kind, *_ in self.calls if kind == "release")

    def of(self, kind: str) -> list[frozenset[str]]:
        return [units for k, units, _ in self.calls if k == kind]


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "RELEASE_RETRY", 0.01)
    monkeypatch.setattr(worker_module, "RELEASE_RETRY_MAX", 0.04)
    monkeypatch.setattr(worker_module, "CLOSE_WAIT", 0.2)


async def serving(api: FakeApi, worker: Worker) -> Worker:
    """`worker`, started on `api`; its `close` stops `api`'s server too."""
    await api.serve()
    close = worker.close

    async def close_both() -> None:
        await close()
        await api.stop_serving()

    worker.close = close_both  # type: ignore[method-assign]
    await worker.start(timeout=5)
    return worker


async def started(api: FakeApi, callbacks: Callbacks) -> Worker:
    worker = Worker(
        "PartitionSet",
        "orders",
        Hooks(
            on_acquire=callbacks.on_acquire,
            on_release=callbacks.on_release,
            on_revoke=callbacks.on_revoke,
        ),
        options=WorkerOptions(handle_signals=False),
        namespace="ns",
        pod_name=ME.name,
        client=api,  # type: ignore[arg-type]
    )
    await serving(api, worker)
    await worker.wait_for(lambda: worker.my_units() == {"0", "1"}, 5)
    return worker


def counters(worker: Worker) -> tuple[int, int]:
    """What /metrics says: release failures so far, units failing now."""
    page = WorkerReport.parse(worker.metrics().render())
    assert f"# TYPE {RELEASE_FAILURES} counter" in worker.metrics().render()
    return page.release_failures["orders"], page.releases_failing["orders"]


def released_in(ack: Ack, unit: str, epochs: range) -> bool:
    """The ack tells the operator that the release of `unit`, releasing in the tables of
    `epochs`, is done."""
    return ack.epoch in epochs and unit not in ack.pending


FIRST = table(1, {"0": mine(1), "1": mine(1)})
RELEASING = table(2, {"0": mine(1), "1": leaving(1, 2)})


async def test_a_release_that_raises_is_retried_and_acknowledged_only_after_it_succeeded() -> None:
    api, callbacks = FakeApi(FIRST), Callbacks(failures=3)
    worker = await started(api, callbacks)
    try:
        api.publish(RELEASING)
        await asyncio.wait_for(callbacks.released.wait(), 5)
        await worker.wait_for(lambda: bool(api.acks) and not api.acks[-1].pending, 5)
    finally:
        await worker.close()
    assert callbacks.of("release") == [frozenset({"1"})] * 4  # three failures, then success
    failing = [ack for ack in api.acks if ack.failing]
    assert failing
    assert all(
        ack.pending == {"1"} and ack.failing == {"1": "RuntimeError: storage unavailable"}
        for ack in failing
    )
    # No ack before the success says unit 1 is released; the last one does.
    first_done = next(i for i, ack in enumerate(api.acks) if released_in(ack, "1", range(2, 3)))
    assert first_done == len(api.acks) - 1
    assert api.acks[-1] == Ack(ME.uid, 2)
    assert counters(worker) == (3, 0)
    assert callbacks.of("revoke") == [frozenset({"0"})]


async def test_a_release_that_always_raises_is_never_acknowledged_and_stops_when_revoked() -> None:
    api, callbacks = FakeApi(FIRST), Callbacks(failures=None)
    worker = await started(api, callbacks)
    try:
        api.publish(RELEASING)
        await worker.wait_for(lambda: bool(api.acks) and bool(api.acks[-1].failing), 5)
        await worker.wait_for(lambda: callbacks.releases() >= 4, 5)
        failures, failing_now = counters(worker)
        assert failures >= 3
        assert failing_now == 1
        assert not worker.owns("1")
        assert worker.token("1") == 1
        assert not await worker.drain(timeout=0.2)  # drain cannot end with a release failing
        # The operator's handoffTimeout: the unit goes to w-1 under a new token.
        api.publish(table(3, {"0": mine(1), "1": theirs(3)}))
        await worker.wait_for(lambda: callbacks.of("revoke") == [frozenset({"1"})], 5)
        tries = callbacks.releases()
        await asyncio.sleep(0.2)  # several retry periods
        assert callbacks.releases() == tries  # retries stopped with the revoke
        assert worker.token("1") is None
        assert counters(worker)[1] == 0
    finally:
        await worker.close()
    assert not any(released_in(ack, "1", range(2, 3)) for ack in api.acks)


async def test_a_hanging_release_is_never_acknowledged_nor_blocks_other_units() -> None:
    api, callbacks = FakeApi(FIRST), Callbacks(hang=True)
    worker = await started(api, callbacks)
    api.publish(RELEASING)
    await worker.wait_for(lambda: callbacks.releases() == 1, 5)
    # Another unit granted meanwhile is acquired and served while the release hangs.
    api.publish(table(3, {"0": mine(1), "1": leaving(1, 2), "2": mine(3)}))
    await worker.wait_for(lambda: worker.owns("2"), 5)
    assert not worker.owns("1")
    assert worker.token("1") == 1
    await worker.close()  # cancels the hung callback after CLOSE_WAIT, acknowledges nothing
    assert not any(released_in(ack, "1", range(2, 4)) for ack in api.acks)
    assert not any(ack.failing for ack in api.acks)  # hanging is not failing: no error yet
    assert set().union(*callbacks.of("revoke")) == {"0", "1", "2"}


async def test_a_release_failing_when_the_worker_closes_is_given_up_without_an_ack() -> None:
    api, callbacks = FakeApi(FIRST), Callbacks(failures=None)
    worker = await started(api, callbacks)
    api.publish(RELEASING)
    await worker.wait_for(lambda: callbacks.releases() >= 2, 5)
    acks = len(api.acks)
    await asyncio.wait_for(worker.close(), 2)  # does not wait for retries
    assert len(api.acks) == acks
    assert not any(released_in(ack, "1", range(2, 3)) for ack in api.acks)
    assert set().union(*callbacks.of("revoke")) == {"0", "1"}
