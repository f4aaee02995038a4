"""The demo worker's grain mode, in one process: three workers on their own loopback addresses
place through directors over the same table and hand remote activations to each other over
HTTP; lifetimes end activations; failures and StatelessWorker reuse are counted."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket

import aiohttp
from aiohttp import web

from apportion.api.worker_report import WorkerReport, parse, render
from apportion.grains import PlacementDirector
from apportion_dev.grains.grain_app import DEMO_METRIC_HELP, DriveSpec, GrainDemo
from tests.unit.test_director import members, table

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def free_port_on_all() -> int:
    while True:
        with socket.socket() as probe:
            probe.bind((HOSTS[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in HOSTS[1:]:
                with socket.socket() as other:
                    other.bind((host, port))
            return port
        except OSError:
            continue


def three_members(strategy: dict, **kw):
    found = members()[:3]
    with_addresses = [
        m.model_copy(update={"address": h}) for m, h in zip(found, HOSTS, strict=True)
    ]
    return table(strategy=strategy, table_members=with_addresses, **kw)


@contextlib.asynccontextmanager
async def workers(doc):
    """Three demo workers over `doc`, serving HTTP on their own addresses and one port."""
    port = free_port_on_all()
    demos, runners = [], []
    try:
        for i, host in enumerate(HOSTS):
            director = PlacementDirector.from_documents([doc], f"w-{i}", rng=random.Random(i))
            demo = GrainDemo(director, port=port, rng=random.Random(10 + i))
            app = web.Application()
            demo.add_routes(app)
            runner = web.AppRunner(app)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, host, port).start()
            demos.append(demo)
        yield demos, port
    finally:
        for demo in demos:
            await demo.close()
        for runner in runners:
            await runner.cleanup()


async def test_remote_placements_are_hosted_by_the_chosen_member() -> None:
    async with workers(three_members({"name": "HashBased"})) as (demos, _):
        ids = tuple(f"g/{i}" for i in range(60))
        placed = await demos[0].drive(DriveSpec("carts", ids=ids))
        assert sum(placed.values()) == 60
        assert set(placed) == {"w-0", "w-1", "w-2"}
        hosted = {d.director.local_member: d.director.hosted["carts"] for d in demos}
        assert hosted == dict(placed), "every activation runs where the director placed it"
        assert all(not d.failures for d in demos)


async def test_lifetimes_end_activations() -> None:
    async with workers(three_members({"name": "PreferLocal"})) as (demos, _):
        await demos[1].drive(DriveSpec("carts", count=5, lifetime=0.2))
        assert demos[1].director.hosted["carts"] == 5
        for _ in range(600):  # polled: the lifetimes end on their own timers
            if demos[1].director.hosted["carts"] == 0:
                break
            await asyncio.sleep(0.05)
        assert demos[1].director.hosted["carts"] == 0
        assert demos[1].director.started["carts"] == 5


async def test_drive_over_http_and_metrics() -> None:
    async with workers(three_members({"name": "Random"})) as (demos, port):
        async with aiohttp.ClientSession() as http:
            url = f"http://{HOSTS[2]}:{port}/grains/drive"
            async with http.post(
                url, json={"grainType": "carts", "count": 30, "rate": 0}
            ) as answer:
                assert answer.status == 200
                placed = (await answer.json())["placed"]
            async with http.get(f"http://{HOSTS[2]}:{port}/grains") as answer:
                state = await answer.json()
            async with http.post(url, json={"count": 3}) as answer:
                assert answer.status == 400
        assert sum(placed.values()) == 30
        assert {p["member"]: p["count"] for p in state["placements"]} == placed
        total = sum(
            WorkerReport.parse(render(d.samples())).activations.get("carts", 0) for d in demos
        )
        assert total == 30


async def test_failures_and_reuse_are_counted() -> None:
    doc = three_members({"name": "StatelessWorker", "statelessWorker": {"maxLocal": 2}})
    async with workers(doc) as (demos, _):
        await demos[0].drive(DriveSpec("carts", ids=("pool",) * 5))
        assert demos[0].director.hosted["carts"] == 2
        assert demos[0].reused["carts"] == 3
        await demos[0].drive(DriveSpec("unknown", count=2))
        assert demos[0].failures["unknown", "NoPlacementTable"] == 2
        samples = parse(render(demos[0].samples(), helps=DEMO_METRIC_HELP))
        values = {(s.name, tuple(sorted(s.labels.values()))): s.value for s in samples}
        assert values["apportion_grain_reused", ("carts",)] == 3
        assert values["apportion_grain_placement_failures", ("NoPlacementTable", "unknown")] == 2


async def test_a_peer_that_does_not_answer_is_a_failed_hand_over() -> None:
    doc = three_members({"name": "HashBased"})
    unreachable = [m.model_copy(update={"address": "127.0.0.99"}) for m in doc.members]
    async with workers(doc.model_copy(update={"members": unreachable})) as (demos, _):
        placed = await demos[0].drive(DriveSpec("carts", ids=tuple(f"g/{i}" for i in range(20))))
        remote = sum(n for m, n in placed.items() if m != "w-0")
        assert remote > 0
        assert demos[0].failures["carts", "HandOverFailed"] == remote
