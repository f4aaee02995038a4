"""What only the operator can judge: a selector that matches no pod, a workload that does not
exist. The set turns Degraded with a reason and a Warning Event; the last published assignment is
kept untouched, and placement resumes when members reappear."""

from __future__ import annotations

import json
from datetime import datetime

from unitset_support import (
    apply,
    condition,
    counts,
    demo_worker,
    events,
    get,
    is_true,
    read_table,
    ready_pods,
    unit_set,
    workers,
)


def test_selector_matching_nothing_degrades_and_keeps_the_last_assignment(
    operator, namespace, kubectl, wait_for
) -> None:
    apply(kubectl, namespace, workers("w", 3, grace=1))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=w")) == 3, 60, "3 worker pods")
    spec = {"partitions": 12, "selector": {"matchLabels": {"app": "w"}}}
    apply(kubectl, namespace, unit_set("PartitionSet", "orders", spec))
    wait_for(lambda: is_true(get(kubectl, namespace, "pset", "orders"), "Balanced"), 60, "Balanced")
    good = read_table(kubectl, namespace, "PartitionSet", "orders")
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
    assert obj["status"]["members"] == 0 and obj["status"]["epoch"] == good.epoch
    kept = read_table(kubectl, namespace, "PartitionSet", "orders")
    assert kept.epoch == good.epoch and kept.owners() == good.owners()
    warnings = [e for e in events(kubectl, namespace, "orders") if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["NoMembers"]

    patch = {"spec": {"selector": {"matchLabels": {"app": "w"}}}}
    kubectl("patch", "-n", namespace, "pset", "orders", "--type=merge", "-p", json.dumps(patch))

    def recovered():
        obj = get(kubectl, namespace, "pset", "orders")
        fresh = obj["status"].get("observedGeneration") == 3
        return fresh and is_true(obj, "Ready") and not is_true(obj, "Degraded")

    wait_for(recovered, 30, "Ready again with members back")
    back = read_table(kubectl, namespace, "PartitionSet", "orders")
    assert back.owners() == good.owners() and back.epoch >= good.epoch


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


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
