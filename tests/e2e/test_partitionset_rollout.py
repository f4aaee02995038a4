"""A rolling update of the workers' StatefulSet: rebalancing waits until the rollout settles
(pauseDuringRollout), while the units of every pod the rollout deletes move at once; afterwards
the set rebalances onto the new pods."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from tests.support.unitset import (
    apply,
    condition,
    counts,
    events,
    get,
    is_true,
    published,
    read_table,
    ready_pods,
    unit_set,
    workers,
)

pytestmark = pytest.mark.shares_operator


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_rolling_update_holds_rebalancing_but_moves_units_of_replaced_pods(
    operator, namespace, kubectl, wait_for
) -> None:
    # Each replaced pod counts as available 3 s after Ready: time to see the held round.
    apply(kubectl, namespace, workers("w", 4, grace=1, min_ready=3))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=w")) == 4, 60, "4 worker pods")
    spec = {
        "partitions": 32,
        "workloadRef": {"kind": "StatefulSet", "name": "w"},
        "rebalance": {"interval": "1s", "handoffTimeout": "3s"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "roll", spec))
    wait_for(
        lambda: is_true(get(kubectl, namespace, "pset", "roll"), "Balanced"),
        60,
        "Balanced before the rollout",
    )
    # Since Kubernetes 1.37 (MaxUnavailableStatefulSet on by default) a Parallel StatefulSet
    # replaces every old pod that is not yet available (Ready for minReadySeconds) at once,
    # outside maxUnavailable: start the rollout from available pods, as a real one would.
    wait_for(
        lambda: get(kubectl, namespace, "statefulset", "w")["status"].get("availableReplicas") == 4,
        60,
        "4 available worker pods",
    )
    before = published(kubectl, namespace, "PartitionSet", "roll")
    old_uids = dict(before.member_uids)

    patch = {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
    started = time.time()
    kubectl("patch", "-n", namespace, "statefulset", "w", "--type=merge", "-p", json.dumps(patch))

    held_seen = []
    settled = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = get(kubectl, namespace, "statefulset", "w")
        sts = found["status"]
        obj = get(kubectl, namespace, "pset", "roll")
        balanced = condition(obj, "Balanced")
        if "rollout in progress" in balanced.get("message", ""):
            held_seen.append(balanced)
        # Until the StatefulSet controller has seen the patch, its status still describes the
        # finished rollout of the previous revision.
        if (
            sts.get("observedGeneration") == found["metadata"]["generation"]
            and sts.get("currentRevision") == sts.get("updateRevision")
            and sts.get("updatedReplicas") == 4
            and sts.get("readyReplicas") == 4
        ):
            settled = True
            break
        time.sleep(0.2)
    assert settled, "the rollout did not finish"
    assert held_seen, "Balanced never said that rebalancing waits for the rollout"
    assert held_seen[0]["reason"] == "RebalancePending"

    def balanced_on_new_pods():
        obj = get(kubectl, namespace, "pset", "roll")
        table = read_table(kubectl, namespace, "PartitionSet", "roll")
        fresh = all(table.member_uids.get(f"w-{i}") != old_uids[f"w-{i}"] for i in range(4))
        return table if fresh and is_true(obj, "Balanced") else None

    after = wait_for(balanced_on_new_pods, 60, "Balanced on the new pods")
    assert counts(after) == {"w-0": 8, "w-1": 8, "w-2": 8, "w-3": 8}

    evs = [e for e in events(kubectl, namespace, "roll") if _seconds(e["eventTime"]) >= started]
    moved = {e["reason"] for e in evs} & {"OwnerGone", "HandoffTimedOut", "HandoffCompleted"}
    assert moved, "units of replaced pods moved"
    rounds = [e for e in evs if e["reason"] == "Rebalancing"]
    assert rounds, "a rebalance round follows the rollout"
    # The rollout settled (as `kubectl rollout status` has it: every pod updated and Ready) when
    # its last new pod turned Ready, by the Ready condition's own timestamp (whole seconds),
    # not by when this loop happened to poll, which lags under load.
    ready_since = max(
        _seconds(c["lastTransitionTime"])
        for pod in ready_pods(kubectl, namespace, "app=w")
        for c in pod["status"]["conditions"]
        if c["type"] == "Ready"
    )
    early = [e for e in rounds if _seconds(e["eventTime"]) < ready_since]
    assert early == [], f"rebalanced during the rollout: {[e['note'] for e in early]}"
