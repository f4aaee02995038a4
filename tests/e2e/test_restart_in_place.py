"""Restarts in place (issue 24, docs/handoff.md "Restarts in place"): demo workers as real
processes under the operator, a worker's process SIGKILLed so that the pod simulator restarts
its container (the pod NotReady meanwhile, same uid), judged from the published table's unit
epochs and from the workers' own serving logs.

- Within `rebalance.restartGrace`: no unit moves; the restarted process acquires its units
  again under their tokens, and no other pod ever serves them.
- A restart that outlasts the grace (the process comes back only after a sleep, the pod NotReady
  until it answers its readiness probe): the units move to the other pods.
- A StatefulSet pod deleted (forced, or gracefully as a rolling update does: then released to
  nobody first) and recreated under its name within the grace: its units wait unowned and
  return to the new incarnation under new tokens; no sibling serves them.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from apportion.api.assignment import AssignmentTable
from tests.support.unitset import (
    Ownership,
    apply,
    demo_worker,
    events,
    get,
    overlaps,
    ownership_log,
    read_table,
    reasons,
    unit_set,
    worker_pid,
    workers,
)

pytestmark = pytest.mark.shares_operator

SET = "rip"
PODS = [f"{SET}-{i}" for i in range(3)]
VICTIM = "rip-0"


def slow_restarts(flag: Path) -> dict[str, Any]:
    """The demo workers' StatefulSet, whose processes start only after 6 s once `flag` exists,
    and whose pods are Ready only when the worker answers on its port."""
    command = " ".join(demo_worker("PartitionSet", SET))
    script = f"if [ -e {flag} ]; then sleep 6; fi; exec {command}"
    sts = workers(SET, 3, command=["sh", "-c", script])
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"] = {
        "httpGet": {"path": "/metrics", "port": 8080},
        "periodSeconds": 1,
        "failureThreshold": 1,
    }
    return sts


def place(dev_cluster: Any, namespace: str, grace: str, sts: dict[str, Any]) -> AssignmentTable:
    """A PartitionSet of 6 over the StatefulSet's 3 demo workers, placed and served: the table
    every worker serves."""
    kubectl = dev_cluster.kubectl
    spec = {
        "partitions": 6,
        "workloadRef": {"kind": "StatefulSet", "name": SET},
        "rebalance": {"handoffTimeout": "6s", "interval": "1s", "restartGrace": grace},
    }
    apply(kubectl, namespace, sts)
    apply(kubectl, namespace, unit_set("PartitionSet", SET, spec))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        table = read_table(kubectl, namespace, "PartitionSet", SET)
        served = {
            (o.pod, o.unit, o.token)
            for o in ownership_log(dev_cluster, namespace, PODS, f"PartitionSet/{SET}")
            if o.action == "acquire"
        }
        if table is not None and all(
            s.owner is not None and (s.owner, u, s.epoch) in served for u, s in table.units.items()
        ):
            return table
        time.sleep(0.5)
    pytest.fail("the set was never placed and served")


def test_a_container_restart_within_the_grace_moves_nothing(
    dev_cluster, namespace, operator, wait_for
) -> None:
    kubectl = dev_cluster.kubectl
    sts = workers(SET, 3, command=demo_worker("PartitionSet", SET))
    before = place(dev_cluster, namespace, "30s", sts)
    mine = {u for u, s in before.units.items() if s.owner == VICTIM}
    assert mine
    pid = worker_pid(namespace, VICTIM)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    def back() -> bool:
        pod = get(kubectl, namespace, "pod", VICTIM)
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]
        )
        try:
            restarted = worker_pid(namespace, VICTIM) != pid
        except LookupError:
            restarted = False
        return ready and restarted and pod["metadata"]["uid"] == before.member_uids[VICTIM]

    wait_for(back, timeout=60, message="the worker's container was never restarted")

    def since_kill() -> list[Any]:
        log = ownership_log(dev_cluster, namespace, PODS, f"PartitionSet/{SET}")
        return [o for o in log if o.time > killed_at and o.action in ("acquire", "release", "stop")]

    # Ready comes from the probe, its units from the table it reads next: on a loaded machine
    # that can take seconds, so wait for the acquire rather than a fixed time after Ready.
    wait_for(
        lambda: any(o.pod == VICTIM for o in since_kill()),
        timeout=60,
        message="the restarted worker never took its units back",
    )
    time.sleep(3.0)  # passes enough for a move, had the operator wanted one

    after = read_table(kubectl, namespace, "PartitionSet", SET)
    assert after is not None
    assert {u: (s.owner, s.epoch) for u, s in after.units.items()} == {
        u: (s.owner, s.epoch) for u, s in before.units.items()
    }, "a unit moved or got a new token"
    log = ownership_log(dev_cluster, namespace, PODS, f"PartitionSet/{SET}")
    since = since_kill()
    assert {(o.pod, o.action) for o in since} == {(VICTIM, "acquire")}, since
    assert {o.unit for o in since} == mine, "the restarted process serves its units again"
    assert {o.token for o in since} <= {before.units[o.unit].epoch for o in since}
    assert overlaps(log) == []
    assert "HeldForRestart" in reasons(events(kubectl, namespace, SET))


def test_a_restart_that_outlasts_the_grace_moves_the_units(
    dev_cluster, namespace, operator, tmp_path, wait_for
) -> None:
    kubectl = dev_cluster.kubectl
    flag = tmp_path / "slow"
    before = place(dev_cluster, namespace, "2s", slow_restarts(flag))
    mine = {u for u, s in before.units.items() if s.owner == VICTIM}
    pid = worker_pid(namespace, VICTIM)
    flag.touch()
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    def taken() -> set[str] | None:
        elsewhere = {
            o.unit
            for o in ownership_log(dev_cluster, namespace, PODS, f"PartitionSet/{SET}")
            if o.action == "acquire" and o.time > killed_at and o.pod != VICTIM
        }
        return (elsewhere & mine) or None

    moved = wait_for(taken, timeout=60, message="no unit left the pod that restarts too slowly")
    table = read_table(kubectl, namespace, "PartitionSet", SET)
    assert table is not None
    assert all(table.units[u].epoch > before.units[u].epoch for u in moved)
    log = ownership_log(dev_cluster, namespace, PODS, f"PartitionSet/{SET}")
    # SIGKILL ended the victim's serving, which its log cannot say.
    died = [Ownership(killed_at, VICTIM, "stop", u, 0, None) for u in sorted(mine)]
    assert overlaps(sorted([*log, *died], key=lambda o: o.time)) == []
    status = json.loads(kubectl("get", "partitionset", SET, "-n", namespace, "-o", "json").stdout)[
        "status"
    ]
    held = {hold["pod"]: hold["units"] for hold in status.get("restartHolds") or ()}
    assert held.get(VICTIM, "") == "", "the grace is spent: nothing is held for it any more"


@pytest.mark.parametrize("deletion", ["forced", "graceful"])
def test_a_statefulset_pod_recreated_within_the_grace_gets_its_units_back(
    dev_cluster, namespace, operator, wait_for, deletion
) -> None:
    """Deleted, the pod comes back under its name as a new incarnation: its units wait unowned
    for it and return under new tokens, and no other pod serves them meanwhile. Force-deleted,
    its process is stopped at once; deleted gracefully (as a rolling update does), it releases
    them to nobody first, through the hand-off, and exits as soon as that is acknowledged."""
    kubectl = dev_cluster.kubectl
    sts = workers(SET, 3, command=demo_worker("PartitionSet", SET))
    before = place(dev_cluster, namespace, "30s", sts)
    mine = {u for u, s in before.units.items() if s.owner == VICTIM}
    deleted_at = time.time()
    force = ["--grace-period=0", "--force"] if deletion == "forced" else ["--wait=false"]
    kubectl("delete", "pod", VICTIM, "-n", namespace, *force)

    def returned() -> AssignmentTable | None:
        table = read_table(kubectl, namespace, "PartitionSet", SET)
        if table is None or table.member_uids.get(VICTIM) in (None, before.member_uids[VICTIM]):
            return None
        served = {
            o.unit
            for o in ownership_log(dev_cluster, namespace, [VICTIM], f"PartitionSet/{SET}")
            if o.action == "acquire" and o.time > deleted_at
        }
        back = all(table.units[u].owner == VICTIM for u in mine) and served >= mine
        return table if back else None

    after = wait_for(returned, timeout=90, message="the recreated pod never got its units back")
    assert all(after.units[u].epoch > before.units[u].epoch for u in mine), "new tokens"
    others = {u: (s.owner, s.epoch) for u, s in before.units.items() if u not in mine}
    assert {u: (s.owner, s.epoch) for u, s in after.units.items() if u not in mine} == others
    log = ownership_log(dev_cluster, namespace, PODS, f"PartitionSet/{SET}")
    taken = [o for o in log if o.time > deleted_at and o.pod != VICTIM and o.unit in mine]
    assert taken == [], "a sibling served a unit held for the restart"
    assert "HeldForRestart" in reasons(events(kubectl, namespace, SET))
    if deletion == "graceful":
        released = {o.unit: o.time for o in log if o.pod == VICTIM and o.action == "release"}
        acquired = {
            o.unit: o.time
            for o in log
            if o.pod == VICTIM and o.action == "acquire" and o.time > deleted_at
        }
        assert released.keys() == mine, "the old incarnation released its units"
        assert all(released[u] < acquired[u] for u in mine), "released before acquired again"
