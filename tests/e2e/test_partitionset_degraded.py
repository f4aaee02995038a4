"""What only the operator can judge: a selector that matches no pod, a workload that does not
exist, a release its worker reports failing. The set turns Degraded with a reason and a Warning
Event; the last published assignment is kept untouched, and placement resumes when members
reappear (or the release is acknowledged)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from apportion.api.assignment import Ack, AssignmentTable
from tests.support.unitset import (
    apply,
    condition,
    counts,
    demo_worker,
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


def test_selector_matching_nothing_degrades_and_keeps_the_last_assignment(
    operator, namespace, kubectl, wait_for
) -> None:
    apply(kubectl, namespace, workers("w", 3, grace=1))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=w")) == 3, 60, "3 worker pods")
    spec = {"partitions": 12, "selector": {"matchLabels": {"app": "w"}}}
    apply(kubectl, namespace, unit_set("PartitionSet", "orders", spec))
    wait_for(lambda: is_true(get(kubectl, namespace, "pset", "orders"), "Balanced"), 60, "Balanced")
    good = published(kubectl, namespace, "PartitionSet", "orders")
    assert counts(good) == {"w-0": 4, "w-1": 4, "w-2": 4}

    patch = {"spec": {"selector": {"matchLabels": {"app": "typo"}}}}
    kubectl("patch", "-n", namespace, "pset", "orders", "--type=merge", "-p", json.dumps(patch))

    def degraded():
        obj = get(kubectl, namespace, "pset", "orders")
        observed = obj["status"].get("observedGeneration") == 2
        return obj if observed and is_true(obj, "Degraded") else None

    obj = wait_for(degraded, 30, "Degraded after the selector change")
    assert condition(obj, "Degraded")["reason"] == "NoMembers"
    assert "no worker pod matches the selector" in condition(obj, "Degraded")["message"]
    assert condition(obj, "Ready") | {"lastTransitionTime": None} == {
        "type": "Ready",
        "status": "False",
        "reason": "NoMembers",
        "message": condition(obj, "Degraded")["message"],
        "observedGeneration": 2,
        "lastTransitionTime": None,
    }
    assert obj["status"]["members"] == 0
    assert obj["status"]["epoch"] == good.epoch
    kept = published(kubectl, namespace, "PartitionSet", "orders")
    assert kept.epoch == good.epoch
    assert kept.owners() == good.owners()
    warnings = [e for e in events(kubectl, namespace, "orders") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["NoMembers"]

    patch = {"spec": {"selector": {"matchLabels": {"app": "w"}}}}
    kubectl("patch", "-n", namespace, "pset", "orders", "--type=merge", "-p", json.dumps(patch))

    def recovered():
        obj = get(kubectl, namespace, "pset", "orders")
        fresh = obj["status"].get("observedGeneration") == 3
        return fresh and is_true(obj, "Ready") and not is_true(obj, "Degraded")

    wait_for(recovered, 30, "Ready again with members back")
    back = published(kubectl, namespace, "PartitionSet", "orders")
    assert back.owners() == good.owners()
    assert back.epoch >= good.epoch


def test_missing_workload_is_reported_and_nothing_is_published(
    operator, namespace, kubectl, wait_for
) -> None:
    spec = {"shards": 100, "workloadRef": {"kind": "Deployment", "name": "nowhere"}}
    apply(kubectl, namespace, unit_set("ShardSet", "lost", spec))

    def degraded():
        obj = get(kubectl, namespace, "sset", "lost")
        return obj if is_true(obj, "Degraded") else None

    obj = wait_for(degraded, 30, "Degraded for a missing workload")
    assert condition(obj, "Degraded")["reason"] == "WorkloadNotFound"
    assert "Deployment nowhere does not exist" in condition(obj, "Degraded")["message"]
    assert condition(obj, "Ready")["status"] == "False"
    assert "assignmentConfigMap" not in obj["status"]
    assert read_table(kubectl, namespace, "ShardSet", "lost") is None
    printed = kubectl("get", "-n", namespace, "sset", "lost", "-o", "wide").stdout
    assert "WorkloadNotFound" in printed


def test_workers_that_never_report_load_degrade_after_the_grace_not_before(
    operator, namespace, kubectl, wait_for
) -> None:
    """Workers report a unit's load once they serve it, so the first moments of a set with
    `metrics.scrape` have none: counting units then is no fault. Workers that still report
    nothing after the grace, 30 s at least (here: `--load-profile none`), are one: Degraded,
    with a Warning."""
    command = [*demo_worker("PartitionSet", "quiet"), "--load-profile", "none"]
    apply(kubectl, namespace, workers("q", 2, command=command, grace=1))
    spec = {
        "partitions": 4,
        "selector": {"matchLabels": {"app": "q"}},
        "metrics": {"podMetrics": False, "scrape": {"port": "metrics", "interval": "5s"}},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "quiet", spec))

    def ready() -> dict | None:
        obj = get(kubectl, namespace, "pset", "quiet")
        return obj if is_true(obj, "Ready") and obj["status"].get("members") == 2 else None

    first = wait_for(ready, 60, "Ready over both workers")
    assert not is_true(first, "Degraded"), condition(first, "Degraded")
    grace = 30  # at least 30 s (two 5 s scrapes and the 2 s timeout are less)
    created = _seconds(first["metadata"]["creationTimestamp"])

    def degraded() -> dict | None:
        obj = get(kubectl, namespace, "pset", "quiet")
        return obj if is_true(obj, "Degraded") else None

    obj = wait_for(degraded, 90, "Degraded for workers that report no load")
    assert condition(obj, "Degraded")["reason"] == "MetricsUnavailable"
    assert 'apportion_unit_load{set="quiet"}' in condition(obj, "Degraded")["message"]
    assert _seconds(condition(obj, "Degraded")["lastTransitionTime"]) >= created + grace - 1
    assert obj["status"]["metricsSource"] != "WorkerLoad"
    warnings = [e for e in events(kubectl, namespace, "quiet") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["MetricsUnavailable"]


def test_a_release_its_worker_reports_failing_is_shown_until_it_is_acknowledged(
    operator, namespace, kubectl, wait_for
) -> None:
    """The test plays the owner whose release callback fails: its ack keeps the unit pending and
    says why (`failing`). The hand-off waits; the set shows it (Warning Event, Degraded,
    `status.releasesFailing`, through the real CRD schema) until the owner acknowledges."""
    apply(kubectl, namespace, workers("w", 2, grace=1))  # simulated: they never ack by themselves
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=w")) == 2, 60, "2 worker pods")
    spec = {
        "partitions": 4,
        "selector": {"matchLabels": {"app": "w"}},
        "rebalance": {"interval": "1s", "handoffTimeout": "10m"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "orders", spec))
    wait_for(lambda: is_true(get(kubectl, namespace, "pset", "orders"), "Balanced"), 60, "Balanced")
    kubectl("scale", "-n", namespace, "statefulset", "w", "--replicas=3")

    def releasing() -> AssignmentTable | None:
        found = read_table(kubectl, namespace, "PartitionSet", "orders")
        return found if found is not None and found.releasing() else None

    moving = wait_for(releasing, 60, "a unit released to w-2")
    [(unit, release)] = moving.releasing().items()
    owner = moving.units[unit].owner
    assert release.to == "w-2"
    assert owner is not None
    uid = get(kubectl, namespace, "pod", owner)["metadata"]["uid"]

    def ack(**fields: Any) -> None:
        text = Ack(uid, moving.epoch, **fields).to_annotation()
        patch = {"metadata": {"annotations": {moving.set_ref.ack_annotation: text}}}
        kubectl("patch", "-n", namespace, "pod", owner, "--type=merge", "-p", json.dumps(patch))

    ack(pending=frozenset({unit}), failing={unit: "OSError: [Errno 28] No space left on device"})

    def failing() -> dict | None:
        obj = get(kubectl, namespace, "pset", "orders")
        return obj if obj["status"].get("releasesFailing") == 1 else None

    obj = wait_for(failing, 30, "releasesFailing in the status")
    assert condition(obj, "Degraded")["reason"] == "ReleaseFailing"
    message = f"{owner} cannot release 1 unit(s) ({unit}): OSError: [Errno 28] No space left"
    assert condition(obj, "Degraded")["message"].startswith(message)
    assert obj["status"]["movesInProgress"] == 1
    warnings = wait_for(
        lambda: [e for e in events(kubectl, namespace, "orders") if e["type"] == "Warning"],
        30,
        "the ReleaseFailing Event",
    )
    assert [e["reason"] for e in warnings] == ["ReleaseFailing"]
    assert warnings[0]["note"].startswith(message)
    still = read_table(kubectl, namespace, "PartitionSet", "orders")
    assert still is not None
    assert still.units[unit].owner == owner

    ack()  # the retry succeeded: the release is acknowledged

    def handed_over() -> dict | None:
        obj = get(kubectl, namespace, "pset", "orders")
        done = obj["status"].get("releasesFailing") == 0 and not is_true(obj, "Degraded")
        return obj if done and obj["status"].get("movesInProgress") == 0 else None

    wait_for(handed_over, 30, "the hand-off completed and nothing failing")
    final = read_table(kubectl, namespace, "PartitionSet", "orders")
    assert final is not None
    assert final.units[unit].owner == "w-2"


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
