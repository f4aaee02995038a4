"""Cut off or paused workers (issue 20, docs/handoff.md "Cut off or paused"): demo workers as
real processes under the operator, judged from their own serving logs and from HTTP requests to
them, never from the operator's view.

- An API server outage longer than the serving lease (the API server SIGSTOPped: its
  connections hang, as behind a dropped route): every worker stops serving, and all serve again
  soon after it ends, with no unit moved because of it. Shorter than the lease: nobody stops.
- A worker SIGSTOPped for longer than `handoffTimeout` while a drain releases its units:
  they go to the new pod when the hand-off times out, and after SIGCONT the paused worker
  serves none of them, not even before it has re-read the table.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from apportion.api.pods import DRAIN_ANNOTATION
from tests.support.unitset import (
    Operator,
    apply,
    demo_worker,
    events,
    get,
    overlaps,
    ownership_log,
    read_table,
    unit_set,
    worker_pid,
    workers,
)

SET = "cuts"
UNITS = 6
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def ask(ip: str, unit: int) -> int:
    """The HTTP status a worker gives a key of `unit` (netherite `!n`: the key names its unit);
    0 when it does not answer."""
    try:
        with _http.open(f"http://{ip}:8080/key/k!{unit}", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


@pytest.fixture
def placed(dev_cluster, crds, namespace, tmp_path) -> Iterator[dict[str, Any]]:
    """A PartitionSet of 6 over 3 demo workers, handoffTimeout 6 s (lease 2 s), placed."""
    kubectl = dev_cluster.kubectl
    spec = {
        "partitions": UNITS,
        "selector": {"matchLabels": {"app": "cut"}},
        "rebalance": {"handoffTimeout": "6s", "interval": "1s"},
    }
    apply(kubectl, namespace, workers("cut", 3, command=demo_worker("PartitionSet", SET)))
    operator = Operator(dev_cluster, namespace, tmp_path / "operator.log")
    apply(kubectl, namespace, unit_set("PartitionSet", SET, spec))
    deadline = time.monotonic() + 120
    ips: dict[str, str] = {}
    while time.monotonic() < deadline:
        table = read_table(kubectl, namespace, "PartitionSet", SET)
        pods = json.loads(kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
        ips = {p["metadata"]["name"]: p["status"].get("podIP", "") for p in pods}
        owners = {u: s.owner for u, s in table.units.items()} if table else {}
        if len(set(owners.values()) - {None}) == 3 and all(
            ips.get(owner or "") and ask(ips[owner or ""], int(u)) == 200
            for u, owner in owners.items()
        ):
            break
        time.sleep(0.5)
    else:
        pytest.fail("the set was never placed and served")
    try:
        yield {"namespace": namespace, "ips": ips, "table": table, "operator": operator}
    finally:
        operator.stop()


def serving_gauge(ip: str) -> float:
    """The worker's own `apportion_worker_serving` for the set, from its /metrics."""
    with _http.open(f"http://{ip}:8080/metrics", timeout=2) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(f'apportion_worker_serving{{set="{SET}"}}'):
                return float(line.split()[-1])
    raise LookupError(f"{ip} exports no apportion_worker_serving for {SET}")


def served(placed: dict[str, Any]) -> dict[int, int]:
    """unit → HTTP status its owner in the placed table gives."""
    table, ips = placed["table"], placed["ips"]
    return {int(u): ask(ips[s.owner], int(u)) for u, s in table.units.items()}


def test_an_api_outage_longer_than_the_lease_stops_every_worker_and_moves_nothing(
    dev_cluster, placed, wait_for
) -> None:
    namespace, table = placed["namespace"], placed["table"]
    pods = sorted(placed["ips"])
    api = dev_cluster.pid("kube-apiserver")
    os.kill(api, signal.SIGSTOP)
    cut = time.time()
    try:

        def refused() -> dict[int, int] | None:
            statuses = served(placed)
            return statuses if set(statuses.values()) == {503} else None

        statuses = wait_for(
            refused, timeout=15, message="workers kept serving through an API server outage"
        )
        assert set(statuses) == set(range(UNITS))
        time.sleep(2.0)  # the outage goes on: still nobody serves
        assert set(served(placed).values()) == {503}
        # What a Prometheus scraping the workers (not through the API server) sees meanwhile.
        assert {ip: serving_gauge(ip) for ip in placed["ips"].values()} == dict.fromkeys(
            placed["ips"].values(), 0.0
        )
    finally:
        os.kill(api, signal.SIGCONT)
    back = time.time()
    wait_for(
        lambda: set(served(placed).values()) == {200},
        timeout=30,
        message="the workers did not serve again after the outage",
    )
    resumed = time.time()
    log = ownership_log(dev_cluster, namespace, pods, f"PartitionSet/{SET}")
    during = [e for e in log if e.time >= cut]
    suspended = {e.unit for e in during if e.action == "suspend"}
    assert suspended == {str(u) for u in range(UNITS)}
    assert {e.action for e in during} == {"suspend", "resume"}  # nothing moved
    assert overlaps(log) == []
    after = read_table(dev_cluster.kubectl, namespace, "PartitionSet", SET)
    assert after is not None
    assert {u: s.owner for u, s in after.units.items()} == {
        u: s.owner for u, s in table.units.items()
    }
    # Nothing could be written meanwhile: each worker's next ack tells the operator, which
    # counts them in the status and says so in an Event per worker.
    status = wait_for(
        lambda: (
            (s := get(dev_cluster.kubectl, namespace, "partitionset", SET)["status"])
            and s.get("servingSuspensions") == len(pods)
            and s
        ),
        timeout=30,
        message="the status never counted the workers' suspensions",
    )
    told = wait_for(
        lambda: (
            (
                found := [
                    e
                    for e in events(dev_cluster.kubectl, namespace, SET)
                    if e["reason"] == "ServingSuspended"
                ]
            )
            and len(found) >= len(pods)
            and found
        ),
        timeout=30,
        message="no ServingSuspended Event for every worker",
    )
    assert sorted(e["note"].split()[0] for e in told) == pods
    for event in told:
        seconds = float(event["note"].split(" for ")[1].split("s:")[0])
        assert 0 < seconds <= resumed - cut, event["note"]  # within what the test saw
    assert status["servingSuspensions"] == len(pods)
    print(f"\nserving again {resumed - back:.2f}s after the API server came back")


def test_an_api_outage_shorter_than_the_lease_stops_nobody(dev_cluster, placed) -> None:
    namespace = placed["namespace"]
    api = dev_cluster.pid("kube-apiserver")
    os.kill(api, signal.SIGSTOP)
    cut = time.time()
    try:
        time.sleep(0.5)  # a quarter of the 2 s lease
        assert set(served(placed).values()) == {200}
    finally:
        os.kill(api, signal.SIGCONT)
    time.sleep(2.5)
    assert set(served(placed).values()) == {200}
    log = ownership_log(dev_cluster, namespace, sorted(placed["ips"]), f"PartitionSet/{SET}")
    assert [e for e in log if e.time >= cut and e.action == "suspend"] == []


def test_a_worker_paused_past_the_handoff_timeout_serves_nothing_it_lost(
    dev_cluster, placed, wait_for
) -> None:
    namespace, table, ips = placed["namespace"], placed["table"], placed["ips"]
    kubectl = dev_cluster.kubectl
    victim = "cut-0"
    held = sorted(int(u) for u, s in table.units.items() if s.owner == victim)
    pid = worker_pid(namespace, victim)
    os.kill(pid, signal.SIGSTOP)
    paused_at = time.time()
    try:
        # `kubectl apportion drain`: every unit of the paused worker is released to the others.
        kubectl("annotate", "pod", victim, "-n", namespace, f"{DRAIN_ANNOTATION}=true")

        def lost() -> list[int] | None:
            now = read_table(kubectl, namespace, "PartitionSet", SET)
            if now is None:
                return None
            gone = [u for u in held if now.units[str(u)].owner not in (victim, None)]
            return gone or None

        moved = wait_for(lost, timeout=60, message="the paused worker's units never moved")
        time.sleep(1.0)
    finally:
        os.kill(pid, signal.SIGCONT)
    # From the moment it runs again, the paused worker answers no key of a unit it lost.
    statuses = [ask(ips[victim], u) for _ in range(20) for u in moved]
    assert 200 not in statuses, statuses
    events = json.loads(kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    assert "HandoffTimedOut" in {e["reason"] for e in events["items"]}
    log = ownership_log(
        dev_cluster, namespace, [f"cut-{i}" for i in range(3)], f"PartitionSet/{SET}"
    )
    assert [
        e
        for e in log
        if e.time >= paused_at
        and e.pod == victim
        and e.action in ("resume", "acquire")
        and int(e.unit) in moved
    ] == []
    # The paused worker's own log: on SIGCONT it ended serving each lost unit (suspended it as
    # its lease had run out, or stopped it on seeing the new table, whichever it noticed first).
    ended = {e.unit for e in log if e.time >= paused_at and e.pod == victim}
    assert ended >= {str(u) for u in moved}
