"""Leader election on a Lease (`apportion.controllers.leadership`), against a store that keeps a
Lease the way the API server does (resourceVersion, 404, 409), with clocks the test moves: one
leader at a time, expiry judged on the standby's own clock, a clean give-up, lost leadership
cancels the leader's work. The real API server runs it in tests/e2e/test_operator_ha.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

import httpx2
import pytest
from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from apportion.controllers.leadership import LeaderElection
from tests.support.present import name_of, present


def api_error(code: int) -> ApiError:
    return ApiError(
        response=httpx2.Response(
            code,
            json={"kind": "Status", "code": code, "message": "", "reason": ""},
            request=httpx2.Request("GET", "https://api/x"),
        )
    )


def metadata(lease: Lease) -> ObjectMeta:
    return present(lease.metadata, "a Lease's metadata")


def spec_of(lease: Lease) -> LeaseSpec:
    return present(lease.spec, "a Lease's spec")


class LeaseStore:
    """One namespace's Leases, with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.version = 0
        self.down = False

    async def get(self, _: type, name: str, *, namespace: str) -> Lease:
        await asyncio.sleep(0)  # let replicas interleave, as requests do
        if self.down:
            raise api_error(503)
        if name not in self.leases:
            raise api_error(404)
        return copy.deepcopy(self.leases[name])

    async def create(self, lease: Lease) -> Lease:
        if self.down:
            raise api_error(503)
        if name_of(lease) in self.leases:
            raise api_error(409)
        return self._store(lease)

    async def replace(self, lease: Lease) -> Lease:
        if self.down:
            raise api_error(503)
        if metadata(self.leases[name_of(lease)]).resourceVersion != metadata(lease).resourceVersion:
            raise api_error(409)
        return self._store(lease)

    def _store(self, lease: Lease) -> Lease:
        self.version += 1
        stored = copy.deepcopy(lease)
        metadata(stored).resourceVersion = str(self.version)
        self.leases[name_of(lease)] = stored
        return stored

    def holder(self) -> Any:
        return spec_of(self.leases["op"]).holderIdentity


def client_of(store: LeaseStore) -> AsyncClient:
    # LeaderElection calls only get, create and replace on its client, which the store serves.
    return cast(AsyncClient, store)


def election(store: LeaseStore, identity: str, clock: list[float]) -> LeaderElection:
    return LeaderElection(client_of(store), "op", "ns", identity, clock=lambda: clock[0])


async def test_the_standby_takes_over_only_after_the_lease_ran_out_on_its_own_clock() -> None:
    store = LeaseStore()
    a_clock, b_clock = [0.0], [1000.0]  # unrelated clocks: only durations on each one count
    a, b = election(store, "a", a_clock), election(store, "b", b_clock)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    b_clock[0] += 14.0
    assert not await b.try_acquire_or_renew()  # 14 s of silence: not yet
    a_clock[0] += 14.0
    assert await a.try_acquire_or_renew()  # a renews: b's count starts again
    b_clock[0] += 14.0
    assert not await b.try_acquire_or_renew()
    b_clock[0] += 1.0
    assert not await b.try_acquire_or_renew()  # 15 s since b saw the renewal would be needed
    b_clock[0] += 15.0
    assert await b.try_acquire_or_renew()  # a went silent for a whole Lease duration
    assert store.holder() == "b"
    assert spec_of(store.leases["op"]).leaseTransitions == 1
    assert not await a.try_acquire_or_renew()  # and a cannot take it back while b renews


async def test_a_conditional_write_makes_one_of_two_racing_replicas_win() -> None:
    store = LeaseStore()
    clock = [0.0]
    a, b = election(store, "a", clock), election(store, "b", clock)
    results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
    assert sorted(results) == [False, True]


async def test_a_clean_stop_gives_the_lease_up_and_a_standby_takes_it_at_once() -> None:
    store = LeaseStore()
    clock = [0.0]
    a, b = election(store, "a", clock), election(store, "b", clock)
    led = asyncio.Event()

    async def lead() -> None:
        led.set()
        await asyncio.Event().wait()

    running = asyncio.ensure_future(a.run(lead))
    await asyncio.wait_for(led.wait(), 5)
    assert a.leading
    assert store.holder() == "a"
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert store.holder() is None
    assert not a.leading
    assert await b.try_acquire_or_renew()  # no waiting for the Lease to run out


async def test_leadership_not_renewed_in_time_cancels_the_leaders_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = LeaseStore()
    clock = [0.0]
    a = LeaderElection(
        client_of(store),
        "op",
        "ns",
        "a",
        retry_period=0.01,
        renew_deadline=0.05,
        lease_seconds=15.0,
        clock=lambda: clock[0],
    )
    stopped = asyncio.Event()

    async def lead() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    running = asyncio.ensure_future(a.run(lead))
    while not a.leading:
        await asyncio.sleep(0.01)
    store.down = True  # the API server is out of reach: no renewal succeeds
    clock[0] += 1.0  # past the renew deadline on the leader's clock
    await asyncio.wait_for(stopped.wait(), 5)
    assert not a.leading
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
