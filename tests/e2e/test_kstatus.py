"""Live objects judged by the real kstatus (sigs.k8s.io/cli-utils, devtools/go/kstatus), as Flux
and Argo CD judge them: a PartitionSet driven through its phases on the dev-cluster (no pods →
Failed, waiting for its first members → InProgress, placed → Current, a scale-out's hand-offs →
InProgress, a hand-off timed out → Failed, a spec change not yet observed → InProgress, a
workloadRef to a missing StatefulSet → Failed), and lighter walks of a ShardSet and a GrainType.

The pods are simulated and never acknowledge a release, so a hand-off lasts until
`handoffTimeout`: every phase holds long enough to be read. With APPORTION_RECORD_STATUSES=1 the
objects read at each phase are written to tests/fixtures/statuses/<kind>-<phase>.json (Argo CD
health scripts are tested against them)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.kstatus import CURRENT, FAILED, IN_PROGRESS, kstatus_of
from tests.support.unitset import API, apply, condition, get, unit_set, workers

pytestmark = pytest.mark.shares_operator

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "statuses"
RECORD = os.environ.get("APPORTION_RECORD_STATUSES") == "1"


def record(obj: dict[str, Any], name: str) -> None:
    """The object as a fixture, without what differs run to run and says nothing of health."""
    if not RECORD:
        return
    obj = json.loads(json.dumps(obj))
    meta = obj["metadata"]
    for key in ("managedFields", "uid", "resourceVersion", "creationTimestamp"):
        meta.pop(key, None)
    meta["namespace"] = "demo"
    FIXTURES.mkdir(parents=True, exist_ok=True)
    (FIXTURES / f"{name}.json").write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


class Walk:
    """One object, read live and judged by kstatus until it says what a phase expects."""

    def __init__(self, kubectl, namespace: str, wait_for, binary: Path, kind: str, name: str):
        self.kubectl, self.namespace, self.wait_for = kubectl, namespace, wait_for
        self.binary, self.kind, self.name = binary, kind, name

    def read(self) -> dict[str, Any]:
        return get(self.kubectl, self.namespace, self.kind.lower(), self.name)

    def until(
        self,
        status: str,
        reason: str | None,
        phase: str,
        *,
        timeout: float = 60,
        check: Callable[[dict[str, Any]], bool] = lambda _: True,
    ) -> dict[str, Any]:
        """Wait until kstatus says `status` because of `reason` (the Stalled or Reconciling
        reason; None: settled), and record the object as `<kind>-<phase>`."""
        seen: list[Any] = []

        def judged() -> dict[str, Any] | None:
            obj = self.read()
            verdict, message = kstatus_of(self.binary, obj)
            why = kstatus_reason(obj)
            seen[:] = [verdict, why, message]
            return obj if verdict == status and why == reason and check(obj) else None

        deadline = time.monotonic() + timeout
        while (obj := judged()) is None:
            assert time.monotonic() < deadline, (
                f"{self.kind} {phase}: wanted {status}/{reason} within {timeout:.0f}s, "
                f"last {seen}: {self.read().get('status')}"
            )
            time.sleep(0.2)
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"], phase
        record(obj, f"{self.kind.lower()}-{phase}")
        return obj


def kstatus_reason(obj: dict[str, Any]) -> str | None:
    """The reason of the abnormal-true condition, or None when neither is True."""
    for type_ in ("Stalled", "Reconciling"):
        found = next(
            (c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), None
        )
        if found is not None and found["status"] == "True":
            return found["reason"]
    return None


def create(kubectl, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Create `obj` and return it as the API server stored it: the CRD's default status."""
    out = kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(obj))
    return json.loads(out.stdout)


def test_a_partitionset_reads_right_under_kstatus_through_its_phases(
    operator, namespace, kubectl, wait_for, kstatus_binary
) -> None:
    spec = {
        "partitions": 12,
        "selector": {"matchLabels": {"app": "kw"}},
        "startup": {"minMembers": 2},
        "rebalance": {"interval": "1s", "handoffTimeout": "8s"},
    }
    created = create(kubectl, namespace, unit_set("PartitionSet", "demo", spec))
    # Without a status kstatus would read Current; the CRD defaults it to observedGeneration 0,
    # so a set the operator has not seen yet is in progress.
    assert created["status"] == {"observedGeneration": 0}
    assert kstatus_of(kstatus_binary, created)[0] == IN_PROGRESS
    record(created, "partitionset-created")
    walk = Walk(kubectl, namespace, wait_for, kstatus_binary, "PartitionSet", "demo")

    # No pod matches: nothing can progress until someone adds pods.
    stalled = walk.until(FAILED, "NoMembers", "stalled")
    assert condition(stalled, "Reconciling")["reason"] == "Stalled"
    assert condition(stalled, "Ready")["status"] == "False"

    # One pod of the two startup.minMembers: the first placement waits (it ends by itself).
    apply(kubectl, namespace, workers("kw", 1))
    waiting = walk.until(IN_PROGRESS, "WaitingForMembers", "placing")
    assert condition(waiting, "Stalled")["status"] == "False"

    # Two: placed, settled.
    kubectl("scale", "-n", namespace, "statefulset/kw", "--replicas=2")
    settled = walk.until(
        CURRENT, None, "settled", check=lambda o: o["status"].get("assignedUnits") == 12
    )
    assert condition(settled, "Reconciling")["reason"] == "Settled"
    assert condition(settled, "Stalled")["reason"] == "AsExpected"
    assert condition(settled, "Ready")["status"] == "True"

    # A spec change: InProgress until the operator has observed the new generation.
    patched = json.loads(
        kubectl(
            "patch",
            "-n",
            namespace,
            "pset/demo",
            "--type=merge",
            "-o",
            "json",
            "-p",
            json.dumps({"spec": {"rebalance": {"interval": "2s"}}}),
        ).stdout
    )
    if patched["status"]["observedGeneration"] < patched["metadata"]["generation"]:
        verdict, message = kstatus_of(kstatus_binary, patched)
        assert verdict == IN_PROGRESS
        assert "generation" in message
        record(patched, "partitionset-generation-behind")
    walk.until(CURRENT, None, "observed", check=lambda o: o["metadata"]["generation"] == 2)

    # A third pod: units are released to it; the simulated pods never acknowledge, so the
    # hand-offs last until handoffTimeout, then the forced end is reported as a stall.
    kubectl("scale", "-n", namespace, "statefulset/kw", "--replicas=3")
    rebalancing = walk.until(IN_PROGRESS, "HandoffInProgress", "rebalancing")
    assert rebalancing["status"]["movesInProgress"] > 0
    timed_out = walk.until(FAILED, "HandoffTimedOut", "handoff-timed-out", timeout=60)
    assert condition(timed_out, "Reconciling")["status"] == "False"


def test_a_workload_ref_to_a_missing_statefulset_is_failed(
    operator, namespace, kubectl, wait_for, kstatus_binary
) -> None:
    spec = {"partitions": 4, "workloadRef": {"kind": "StatefulSet", "name": "nowhere"}}
    apply(kubectl, namespace, unit_set("PartitionSet", "ghost", spec))
    walk = Walk(kubectl, namespace, wait_for, kstatus_binary, "PartitionSet", "ghost")
    obj = walk.until(FAILED, "WorkloadNotFound", "workload-not-found")
    assert "nowhere" in condition(obj, "Stalled")["message"]


def test_a_shardset_reads_right_under_kstatus(
    operator, namespace, kubectl, wait_for, kstatus_binary
) -> None:
    spec = {
        "shards": 60,
        "selector": {"matchLabels": {"app": "sw"}},
        "startup": {"minMembers": 2},  # both pods at once: no hand-off to the second one
        "rebalance": {"interval": "1s", "handoffTimeout": "30s"},
    }
    created = create(kubectl, namespace, unit_set("ShardSet", "carts", spec))
    assert created["status"] == {"observedGeneration": 0}
    assert kstatus_of(kstatus_binary, created)[0] == IN_PROGRESS
    record(created, "shardset-created")
    walk = Walk(kubectl, namespace, wait_for, kstatus_binary, "ShardSet", "carts")
    walk.until(FAILED, "NoMembers", "stalled")
    apply(kubectl, namespace, workers("sw", 2))
    walk.until(CURRENT, None, "settled", check=lambda o: o["status"].get("assignedUnits") == 60)
    kubectl("scale", "-n", namespace, "statefulset/sw", "--replicas=3")
    walk.until(IN_PROGRESS, "HandoffInProgress", "rebalancing")


def test_a_graintype_reads_right_under_kstatus(
    operator, namespace, kubectl, wait_for, kstatus_binary
) -> None:
    pods = 2
    graintype: dict[str, Any] = {
        "apiVersion": API,
        "kind": "GrainType",
        "metadata": {"name": "carts"},
        "spec": {"selector": {"matchLabels": {"app": "silo"}}, "strategy": {"name": "HashBased"}},
    }
    created = create(kubectl, namespace, graintype)
    assert created["status"] == {"observedGeneration": 0}
    assert kstatus_of(kstatus_binary, created)[0] == IN_PROGRESS
    record(created, "graintype-created")
    walk = Walk(kubectl, namespace, wait_for, kstatus_binary, "GrainType", "carts")
    walk.until(FAILED, "NoMembers", "stalled")
    apply(kubectl, namespace, workers("silo", pods))
    settled = walk.until(
        CURRENT, None, "settled", check=lambda o: o["status"].get("compatibleMembers") == pods
    )
    assert condition(settled, "Ready")["reason"] == "Published"
    # A second GrainType claiming the same grain type: a user must resolve it.
    clash = {**graintype, "metadata": {"name": "b-carts"}}
    clash["spec"] = {**graintype["spec"], "grainTypes": ["carts"]}
    apply(kubectl, namespace, clash)
    walk.until(FAILED, "GrainTypeConflict", "conflict")
