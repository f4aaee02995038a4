"""The statuses the operator computes, phase by phase, judged by the real kstatus
(sigs.k8s.io/cli-utils pkg/kstatus/status, devtools/go/kstatus): what Flux's `wait`, kubectl-style
waiters and Argo CD's generic health conclude. The expected results follow kstatus' documented
rules for custom resources, written by hand:

- `status.observedGeneration` behind `metadata.generation` → InProgress;
- else the first of `Reconciling=True` (→ InProgress) or `Stalled=True` (→ Failed);
- else `Ready=True` → Current, `Ready` not True → InProgress; no conditions at all → Current.

The binary is built by `make tools` (and by the fixture where it is missing): never skipped."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from apportion.api import PartitionSet, ShardSet
from apportion.api.assignment import ResourceRef
from apportion.api.conditions import condition_time
from apportion.api.graintype import GrainType
from apportion.api.pods import WorkerPod
from apportion.engine.grains.document import build_document
from apportion.engine.grains.status import blocked_status, build_status, invalid_status, problems
from apportion.engine.kstatus import blocked_conditions
from apportion.engine.set_pass import PassInput, PassResult, Problem, initial_table, plan_pass
from apportion.engine.set_status import StatusInput, unit_set_status
from tests.support.kstatus import CURRENT, FAILED, IN_PROGRESS, kstatus, kstatus_of

NOW = 1_700_000_000.0
WALL = datetime(2025, 5, 1, 12, 0, 0, tzinfo=UTC)
GENERATION = 3


def resource(kind: str, status: dict[str, Any] | None, generation: int = GENERATION) -> dict:
    body: dict[str, Any] = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "demo", "namespace": "ns", "generation": generation},
        "spec": {},
    }
    if status is not None:
        body["status"] = status
    return body


CRDS = Path(__file__).resolve().parents[2] / "crds"


def created_status(kind: str) -> dict[str, Any]:
    """The status the API server shows before the operator's first write: the CRD schema's
    defaults (a status read from storage without one is defaulted like any other field)."""
    crd = yaml.safe_load((CRDS / f"{kind.lower()}s.apportion.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    defaulted = dict(schema["default"])
    for name, field in schema["properties"].items():
        if "default" in field:
            defaulted.setdefault(name, field["default"])
    return defaulted


def test_a_new_object_is_in_progress_before_the_operator_writes_a_status(
    kstatus_binary: Path,
) -> None:
    """kstatus reads a custom resource with no status as Current: Flux's `wait` would pass a
    set the operator has not seen. The CRDs default the status so that it reads otherwise."""
    for kind in ("PartitionSet", "ShardSet", "GrainType"):
        status = created_status(kind)
        assert status == {"observedGeneration": 0}, kind
        assert kstatus_of(kstatus_binary, resource(kind, status))[0] == IN_PROGRESS, kind
        assert kstatus_of(kstatus_binary, resource(kind, None))[0] == CURRENT, kind


def verdicts(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def check_verdicts(
    phase: str, status: dict[str, Any] | None, want: str, reason: str | None
) -> dict[str, tuple[str, str]]:
    """The conditions behind a phase's kstatus result, as docs/api.md maps them: all of the
    generation, never both Reconciling and Stalled True, the reason on the one that is True.
    Returns the conditions' (status, reason) by type for further checks."""
    assert status is not None, phase
    assert status["observedGeneration"] == GENERATION, phase
    assert {c["observedGeneration"] for c in status["conditions"]} == {GENERATION}, phase
    conditions = verdicts(status)
    reconciling, stalled = conditions["Reconciling"], conditions["Stalled"]
    assert not (reconciling[0] == stalled[0] == "True"), f"{phase}: never both True"
    if want == FAILED:
        assert stalled == ("True", reason), phase
        assert reconciling == ("False", "Stalled"), phase
    elif want == IN_PROGRESS:
        assert reconciling == ("True", reason), phase
        assert stalled == ("False", "AsExpected"), phase
    else:
        assert reconciling == ("False", "Settled"), phase
        assert stalled == ("False", "AsExpected"), phase
    return conditions


# ------------------------------------------------------------------------------- unit sets

UNIT_SETS = {
    "PartitionSet": lambda **kw: (
        PartitionSet.model_validate(
            {
                "metadata": {"name": "demo"},
                "spec": {"partitions": 16, "selector": {"matchLabels": {"app": "w"}}, **kw},
            }
        ).spec
    ),
    "ShardSet": lambda **kw: (
        ShardSet.model_validate(
            {
                "metadata": {"name": "demo"},
                "spec": {"shards": 100, "selector": {"matchLabels": {"app": "w"}}, **kw},
            }
        ).spec
    ),
}


def workers(n: int, **changes: Any) -> list[WorkerPod]:
    return [WorkerPod(f"w-{i}", f"uid-w-{i}", **changes) for i in range(n)]


def run(kind: str, spec: Any, table: Any, pods: list[WorkerPod], **kw: Any) -> PassResult:
    return plan_pass(PassInput(spec, table, GENERATION, pods, now=NOW, **kw))


def status_of(table: Any, result: PassResult, pods: list[WorkerPod], **kw: Any) -> dict:
    return unit_set_status(StatusInput(table, result, pods, GENERATION, "cm", NOW, **kw))


def phases(kind: str) -> dict[str, dict[str, Any] | None]:
    """The status of one set at each phase, as the operator computes it."""
    spec = UNIT_SETS[kind](rebalance={"interval": "1s", "handoffTimeout": "5s"})
    ref = ResourceRef(kind, "ns", "demo", "set-uid")
    empty = initial_table(ref, spec, GENERATION)
    four = workers(4)
    first = run(kind, spec, empty, four)
    assert first.new_table is not None
    placed = first.new_table
    five = workers(5)
    scale_out = run(kind, spec, placed, five)
    assert scale_out.new_table is not None
    waiting = run(kind, spec, empty, workers(1), desired_members=3, created=NOW - 1)
    timed_out = Problem("HandoffTimedOut", "w-3 did not release 4 unit(s) within 5s")
    now = condition_time(NOW)
    return {
        "created": created_status(kind),
        "waiting": status_of(empty, waiting, workers(1)),
        "placing": status_of(empty, first, four),
        "rebalancing": status_of(scale_out.new_table, scale_out, five),
        "awaiting-metrics": status_of(
            placed, run(kind, spec, placed, four), four, awaiting_loads="counting units"
        ),
        "settled": status_of(placed, run(kind, spec, placed, four), four),
        "no-members": status_of(placed, run(kind, spec, placed, []), []),
        "workload-not-found": status_of(
            placed,
            PassResult(decision=None, problems=(Problem("WorkloadNotFound", "gone"),)),
            [],
        ),
        "handoff-timed-out": status_of(
            placed, run(kind, spec, placed, four), four, extra_problems=[timed_out]
        ),
        "invalid-spec": {
            "observedGeneration": GENERATION,
            "conditions": [
                c.to_json_dict()
                for c in blocked_conditions(
                    (), "InvalidSpec", "spec rejected", generation=GENERATION, now=now
                )
            ],
        },
        "pass-failed": {
            "observedGeneration": GENERATION,
            "conditions": [
                c.to_json_dict()
                for c in blocked_conditions(
                    (), "PassFailed", "API unreachable", generation=GENERATION, now=now
                )
            ],
        },
    }


UNIT_SET_EXPECTED = {
    # the CRD's default status ({observedGeneration: 0}) until the operator's first write
    "created": (IN_PROGRESS, None),
    "waiting": (IN_PROGRESS, "WaitingForMembers"),
    "placing": (IN_PROGRESS, "Placing"),
    "rebalancing": (IN_PROGRESS, "HandoffInProgress"),
    "awaiting-metrics": (IN_PROGRESS, "AwaitingMetrics"),
    "settled": (CURRENT, None),
    "no-members": (FAILED, "NoMembers"),
    "workload-not-found": (FAILED, "WorkloadNotFound"),
    "handoff-timed-out": (FAILED, "HandoffTimedOut"),
    "invalid-spec": (FAILED, "InvalidSpec"),
    "pass-failed": (IN_PROGRESS, "PassFailed"),
}


@pytest.mark.parametrize("kind", sorted(UNIT_SETS))
def test_unit_set_phases_read_as_kstatus_documents(kind: str, kstatus_binary: Path) -> None:
    statuses = phases(kind)
    assert statuses.keys() == UNIT_SET_EXPECTED.keys()
    results = kstatus(kstatus_binary, *(resource(kind, s) for s in statuses.values()))
    got = {phase: r["status"] for phase, r in zip(statuses, results, strict=True)}
    assert got == {phase: want for phase, (want, _) in UNIT_SET_EXPECTED.items()}
    for phase, (want, reason) in UNIT_SET_EXPECTED.items():
        if phase != "created":
            conditions = check_verdicts(phase, statuses[phase], want, reason)
            if want == CURRENT:
                assert conditions["Ready"] == ("True", "Assigned"), phase


@pytest.mark.parametrize("kind", sorted(UNIT_SETS))
def test_a_spec_change_is_in_progress_until_observed(kind: str, kstatus_binary: Path) -> None:
    settled = phases(kind)["settled"]
    status, message = kstatus_of(kstatus_binary, resource(kind, settled, GENERATION + 1))
    assert status == IN_PROGRESS
    assert f"generation is {GENERATION + 1}" in message
    assert kstatus_of(kstatus_binary, resource(kind, settled))[0] == CURRENT


def test_a_pass_that_failed_after_a_stall_stays_failed_only_while_stalled(
    kstatus_binary: Path,
) -> None:
    """Conditions carry over from pass to pass: a PassFailed after an InvalidSpec turns
    Stalled off again (it heals by itself), and a fixed spec settles to Current."""
    now = condition_time(NOW)
    stalled = blocked_conditions((), "InvalidSpec", "bad", generation=1, now=now)
    failed = blocked_conditions(stalled, "PassFailed", "API down", generation=2, now=now)
    body = resource(
        "ShardSet", {"observedGeneration": 2, "conditions": [c.to_json_dict() for c in failed]}, 2
    )
    assert kstatus_of(kstatus_binary, body)[0] == IN_PROGRESS
    assert [c.type for c in failed] == ["Ready", "Reconciling", "Stalled", "Degraded"]


# ------------------------------------------------------------------------------- GrainType


def graintype(**spec: Any) -> GrainType:
    return GrainType.from_raw(
        {
            "apiVersion": "apportion.dev/v1alpha1",
            "kind": "GrainType",
            "metadata": {"name": "carts", "namespace": "ns", "uid": "u", "generation": GENERATION},
            "spec": {"selector": {"matchLabels": {"app": "silo"}}, **spec},
        }
    )


def silo(i: int, ready: bool = True) -> WorkerPod:
    return WorkerPod(f"s-{i}", f"u-{i}", labels={"app": "silo"}, ready=ready, ip=f"10.0.0.{i}")


def grain_status(selected: list[WorkerPod], published: bool = True, **kw: Any) -> dict:
    gt = graintype()
    members = [p for p in selected if p.ready]
    doc = build_document(gt, members, {}, version=2, now=WALL) if published else None
    # Before the first write no table lists members: only the write's own outcome counts then.
    found = problems(gt, selected, doc, **kw) if published else []
    return build_status(gt, selected, doc, found, conditions=[], now=WALL, last_publish_time="T")


def test_graintype_phases_read_as_kstatus_documents(kstatus_binary: Path) -> None:
    statuses = {
        "created": created_status("GrainType"),
        "publishing": grain_status([silo(0)], published=False),
        "members-starting": grain_status([silo(0, ready=False)]),
        "settled": grain_status([silo(0), silo(1)]),
        "no-members": grain_status([]),
        "conflict": grain_status([silo(0)], conflicts={"carts": ["b-carts"]}),
        "publish-failed": grain_status([silo(0)], error="table too large"),
        "invalid-spec": invalid_status(GENERATION, [], "spec rejected", now=WALL),
        "pass-failed": blocked_status(GENERATION, [], "PassFailed", "API down", now=WALL),
    }
    expected = {
        "created": (IN_PROGRESS, None),
        "publishing": (IN_PROGRESS, "Publishing"),
        "members-starting": (IN_PROGRESS, "NoCompatibleMembers"),
        "settled": (CURRENT, None),
        "no-members": (FAILED, "NoMembers"),
        "conflict": (FAILED, "GrainTypeConflict"),
        "publish-failed": (FAILED, "PublishFailed"),
        "invalid-spec": (FAILED, "InvalidSpec"),
        "pass-failed": (IN_PROGRESS, "PassFailed"),
    }
    results = kstatus(kstatus_binary, *(resource("GrainType", s) for s in statuses.values()))
    got = {phase: r["status"] for phase, r in zip(statuses, results, strict=True)}
    assert got == {phase: want for phase, (want, _) in expected.items()}
    for phase, (want, reason) in expected.items():
        if phase != "created":
            check_verdicts(phase, statuses[phase], want, reason)
    behind = resource("GrainType", statuses["settled"], GENERATION + 1)
    assert kstatus_of(kstatus_binary, behind)[0] == IN_PROGRESS


def test_the_kstatus_tool_reads_lists_yaml_streams_and_integer_generations(
    kstatus_binary: Path, tmp_path: Path
) -> None:
    """The tool itself: a List is flattened, YAML documents are read one by one, and a
    generation stays an integer (encoding/json's float64 would make kstatus answer Unknown)."""
    settled = grain_status([silo(0)])
    items = [resource("GrainType", settled), resource("GrainType", settled, GENERATION + 1)]
    listed = kstatus(kstatus_binary, {"apiVersion": "v1", "kind": "List", "items": items})
    assert [r["status"] for r in listed] == [CURRENT, IN_PROGRESS]
    stream = tmp_path / "two.yaml"
    stream.write_text(yaml.safe_dump_all(items))
    done = subprocess.run(
        [str(kstatus_binary), str(stream)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1, "not every object is Current"
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert '"status":"Current"' in lines[0]


RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "statuses"
RECORDED_EXPECTED = {
    "created": IN_PROGRESS,
    "placing": IN_PROGRESS,
    "rebalancing": IN_PROGRESS,
    "generation-behind": IN_PROGRESS,
    "settled": CURRENT,
    "observed": CURRENT,
    "stalled": FAILED,
    "handoff-timed-out": FAILED,
    "workload-not-found": FAILED,
    "conflict": FAILED,
}


def test_the_recorded_live_statuses_read_as_their_names_say(kstatus_binary: Path) -> None:
    """tests/fixtures/statuses/<kind>-<phase>.json, recorded from the dev-cluster by
    tests/e2e/test_kstatus.py (APPORTION_RECORD_STATUSES=1), for health checks to test with."""
    paths = sorted(RECORDED.glob("*.json"))
    kinds = {path.name.split("-", 1)[0] for path in paths}
    assert kinds == {"partitionset", "shardset", "graintype"}
    objects = [json.loads(path.read_text()) for path in paths]
    got = {
        p.stem: r["status"] for p, r in zip(paths, kstatus(kstatus_binary, *objects), strict=True)
    }
    assert got == {p.stem: RECORDED_EXPECTED[p.stem.split("-", 1)[1]] for p in paths}
