"""The demo worker's synthetic load (profiles, request rates), its command line, and its
fenced writes to a real PostgreSQL (tests/support/postgres.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from apportion.api.assignment import AssignmentTable, ResourceRef
from apportion_dev.worker.unit_app import DemoWorker, LoadProfile, RequestRates
from tests.support.postgres import PostgresServer, free_port


def test_profiles_give_each_unit_the_same_load_on_every_worker() -> None:
    rates = RequestRates()
    assert LoadProfile.parse("uniform").load("7", rates) == 1.0
    assert LoadProfile.parse("uniform:2.5").load("7", rates) == 2.5
    zipf = LoadProfile.parse("zipf")
    assert [zipf.load(u, rates) for u in ("0", "1", "3")] == [100.0, 50.0, 25.0]
    assert LoadProfile.parse("zipf:2").load("1", rates) == 25.0
    units = LoadProfile.parse("units:0=50,3=20")
    assert [units.load(u, rates) for u in ("0", "1", "3")] == [50.0, 1.0, 20.0]
    assert LoadProfile.parse("units:0=50,*=0").load("1", rates) == 0.0
    assert LoadProfile.parse("none").reports is False
    assert LoadProfile.parse("requests").reports is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gaussian", "unknown load profile 'gaussian'"),
        ("uniform:-1", "must be a finite number >= 0"),
        ("zipf:x", "is not a number"),
        ("units:", "at least one UNIT=VALUE"),
        ("units:3", "expected UNIT=VALUE"),
        ("units:3=inf", "must be a finite number >= 0"),
        ("none:1", "takes no argument"),
    ],
)
def test_bad_profiles_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadProfile.parse(text)


def test_request_rates_count_the_last_window_per_unit() -> None:
    rates = RequestRates(window=10)
    for second in (100.2, 100.7, 101.0, 105.5):
        rates.count("3", now=second)
    rates.count("4", now=100.0)
    assert rates.rate("3", now=105.9) == 0.4
    assert rates.rate("3", now=110.5) == 0.2  # seconds 100 and 101 left the window
    assert rates.rate("4", now=111.0) == 0.0
    assert rates.rate("5", now=100.0) == 0.0
    rates.forget("3")
    assert rates.rate("3", now=106.0) == 0.0


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "apportion", "demo-worker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_command_line_errors_name_the_problem() -> None:
    missing = run("--kind", "PartitionSet")
    assert missing.returncode == 2
    assert "--kind and --set are required" in missing.stderr
    both = run("--grains", "--set", "demo")
    assert both.returncode == 2
    assert "leave out --kind and --set" in both.stderr
    profile = run("--kind", "ShardSet", "--set", "s", "--load-profile", "zipf:-2")
    assert profile.returncode == 2
    assert "--load-profile: load value '-2'" in profile.stderr
    no_pod = run("--kind", "ShardSet", "--set", "s", env={"PATH": "/usr/bin:/bin"})
    assert no_pod.returncode == 1
    assert "POD_NAME is not set" in no_pod.stdout


class OneUnitWorker:
    """What the demo's request path asks of its Worker, for a pod that believes it owns unit
    "0" under `token` (as a pod cut off under KeepServing does)."""

    def __init__(self, pod: str, token: int) -> None:
        self.pod_name, self.epoch, self.serving = pod, token, True
        self._token = token
        ref = ResourceRef("PartitionSet", "shop", "orders", "uid-1")
        self.table = AssignmentTable.initial(ref, generation=1, key_scheme="netherite", count=1)

    def unit_of(self, key: str) -> str:
        return "0"

    def owns(self, unit: str) -> bool:
        return True

    def token(self, unit: str) -> int:
        return self._token


def demo_pod(pod: str, token: int, postgres: str | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("POD_NAME", pod)
    demo = DemoWorker("PartitionSet", "orders", port=0, namespace="shop", postgres=postgres)
    demo.worker = OneUnitWorker(pod, token)  # type: ignore[assignment]
    return demo


async def serve(demo: DemoWorker, key: str) -> tuple[int, dict[str, Any]]:
    answer = await demo._serve(key, increment=True, number=None)
    assert answer.text is not None
    return answer.status, json.loads(answer.text)


async def test_a_pod_that_lost_its_unit_has_its_writes_refused_and_counts_nothing(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = postgres.create_database("demo_requests")
    old, new = demo_pod("w-0", 3, dsn, monkeypatch), demo_pod("w-1", 5, dsn, monkeypatch)
    try:
        assert (await serve(old, "k"))[0] == 200  # its token is the highest so far
        status, body = await serve(new, "k")
        assert (status, body["count"]) == (200, 1)
        status, body = await serve(old, "k")
        assert status == 409
        assert (body["token"], body["current"]) == (3, 5)
        assert old.counters[(1, "0")]["k"].count == 1  # the refused increment did not count
        assert (await serve(new, "k"))[0] == 200
    finally:
        for demo in (old, new):
            assert demo.requests is not None
            await demo.requests.close()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT scope, pod, token, requests FROM apportion_demo_requests")
        assert rows.fetchall() == [("PartitionSet/shop/orders/uid-1", "w-1", 5, 3)]


async def test_without_postgres_the_demo_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    demo = demo_pod("w-0", 3, None, monkeypatch)
    assert demo.requests is None
    assert (await serve(demo, "k"))[0] == 200


async def test_an_unreachable_postgres_answers_503_and_counts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    demo = demo_pod("w-0", 3, f"host=127.0.0.1 port={free_port()} connect_timeout=2", monkeypatch)
    status, body = await serve(demo, "k")
    assert status == 503
    assert body["reason"].startswith("storage:")
    assert demo.counters[(1, "0")] == {}
