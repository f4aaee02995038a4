"""`kubectl apportion`, run by the real kubectl (built with the control plane) that finds the
`kubectl-apportion` executable of this package on PATH, against a PartitionSet over demo
workers: locate and top agree with the published table, drain hands every unit off a pod and
uncordon lets it take units back, history lists those hand-offs from Events, and plan tells
what the next pass would move without writing anything."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from apportion.engine.keys import get_scheme
from tests.support.unitset import (
    apply,
    counts,
    demo_worker,
    published,
    read_table,
    ready_pods,
    unit_set,
    workers,
)


def plugin_runner(dev_cluster, namespace: str) -> Callable[..., str]:
    # kubectl looks plugins up on PATH: the venv's bin holds kubectl-apportion.
    env = dict(dev_cluster.env)
    env["PATH"] = os.pathsep.join([env["PATH"], str(Path(sys.executable).parent)])

    def run(*args: str, status: int = 0) -> str:
        done = subprocess.run(
            ["kubectl", "apportion", "-n", namespace, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == status, done.stdout + done.stderr
        return done.stdout + done.stderr

    return run


def rows(text: str) -> list[list[str]]:
    return [line.split(None, 3) for line in text.splitlines()[1:]]


def test_locate_top_drain_uncordon_history_and_plan(
    dev_cluster, operator, namespace, kubectl, wait_for
) -> None:
    plugin = plugin_runner(dev_cluster, namespace)
    apply(kubectl, namespace, workers("kw", 3, command=demo_worker("PartitionSet", "k")))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=kw")) == 3, 60, "3 demo workers")
    spec = {
        "partitions": 12,
        "workloadRef": {"kind": "StatefulSet", "name": "kw"},
        "rebalance": {"interval": "1s", "handoffTimeout": "60s"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "k", spec))
    kubectl("wait", "-n", namespace, "--for=condition=Balanced", "pset/k", "--timeout=60s")
    placed = published(kubectl, namespace, "PartitionSet", "k")

    # locate: each key's unit under the set's key scheme, and that unit's owner in the table
    keys = ["order-1", "order-2", "cart-77"]
    units = get_scheme(placed.key_scheme).units(keys, 12).tolist()
    owners = placed.owners()
    expected = [f"{k}\t{u}\t{owners[str(u)]}" for k, u in zip(keys, units, strict=True)]
    assert plugin("locate", "pset/k", *keys).splitlines() == expected

    # top: 4 units, a third of them, on each pod
    top = plugin("top", "k")
    assert top.splitlines()[0].split() == ["POD", "UNITS", "LOAD", "SHARE"]
    assert sorted(rows(top)) == [[f"kw-{i}", "4", "-", "33%"] for i in range(3)]

    assert "no PartitionSet or ShardSet 'nope'" in plugin("top", "nope", status=1)
    assert "SET is NAME, pset/NAME or sset/NAME" in plugin("top", "deploy/k", status=1)

    # drain: kw-1's units move off through hand-offs; uncordon: they come back
    assert "draining" in plugin("drain", "kw-1")
    wait_for(
        lambda: (
            counts(published(kubectl, namespace, "PartitionSet", "k"))
            == {"kw-0": 6, "kw-1": 0, "kw-2": 6}
        ),
        60,
        "kw-1 never handed its units off",
    )
    assert "uncordoned" in plugin("uncordon", "kw-1")
    wait_for(
        lambda: (
            counts(published(kubectl, namespace, "PartitionSet", "k"))
            == {"kw-0": 4, "kw-1": 4, "kw-2": 4}
        ),
        60,
        "units never came back to kw-1",
    )
    history = plugin("history", "k")
    reasons = [row[2] for row in rows(history)]
    assert "HandoffStarted" in reasons
    assert "HandoffCompleted" in reasons
    assert "HandoffTimedOut" not in reasons

    # plan: with the operator stopped, a fourth pod joins; the next pass would move one unit
    # from each pod to it (12 / 4), and planning writes nothing.
    assert operator.stop() == 0
    before = read_table(kubectl, namespace, "PartitionSet", "k")
    kubectl("scale", "-n", namespace, "statefulset/kw", "--replicas=4")
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=kw")) == 4, 60, "a fourth worker")
    plan = plugin("plan", "k")
    header = plan.splitlines().index("UNIT   FROM   TO")
    moves = [line.split() for line in plan.splitlines()[header + 1 : header + 4]]
    assert all(to == "kw-3" for _, _, to in moves), plan
    assert len(moves) == 3, plan
    assert sorted(source for _, source, _ in moves) == ["kw-0", "kw-1", "kw-2"], plan
    assert read_table(kubectl, namespace, "PartitionSet", "k") == before
