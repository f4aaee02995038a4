"""The operator side of placement tables, without a cluster: the table built from pods and their
statistics, the publish gate (urgent at once, load at most every minInterval, noise never), and
status and conditions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from apportion.api.graintype import GrainType
from apportion.api.placement_table import ChangeKind, TableStats
from apportion.api.pods import WorkerPod
from apportion.engine.grains.document import build_document, counted_grain_types, is_compatible
from apportion.engine.grains.gate import PublishGate
from apportion.engine.grains.status import build_status, claimed_grain_types, conflicts, problems
from tests.support.present import present

NOW = datetime(2025, 5, 1, 12, 0, 0, tzinfo=UTC)


def graintype(name: str = "carts", **spec) -> GrainType:
    return GrainType.from_raw(
        {
            "apiVersion": "apportion.dev/v1alpha1",
            "kind": "GrainType",
            "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}", "generation": 4},
            "spec": {"selector": {"matchLabels": {"app": "silo"}}, **spec},
        }
    )


def pod(i: int, *, ready: bool = True, terminating: bool = False, **labels) -> WorkerPod:
    return WorkerPod(
        name=f"w-{i}",
        uid=f"u-{i}",
        labels={"app": "silo", "zone": f"z{i % 2}", **labels},
        ready=ready,
        terminating=terminating,
        ip=f"127.0.0.{10 + i}",
    )


def stats(**kw) -> TableStats:
    base = {
        "cpu_usage": 40.123456,
        "memory_usage": 25.0,
        "available_memory": 3 << 30,
        "max_available_memory": 4 << 30,
        "activation_count": 10,
        "cpu_count": 2,
    }
    return TableStats(**{**base, **kw})


def test_table_lists_compatible_members_sorted_with_labels_address_and_stats() -> None:
    pods = [pod(2), pod(0), pod(1, ready=False), pod(3, terminating=True)]
    members = [p for p in pods if is_compatible(p)]
    doc = build_document(graintype(), members, {"w-2": stats()}, version=5, now=NOW)
    assert doc.member_names() == ["w-0", "w-2"]
    assert doc.members[0].stats is None, "w-0 has not reported"
    w2 = doc.members[1]
    assert w2.address == "127.0.0.12"
    assert w2.labels == {"app": "silo", "zone": "z0"}
    w2_stats = present(w2.stats, "w-2's stats")
    assert w2_stats.cpu_usage == 40.12, "rounded: noise digits are not published"
    assert (w2_stats.activation_count, w2_stats.cpu_count, w2_stats.overloaded) == (10, 2, False)
    assert doc.version == 5
    assert doc.published_at == NOW
    assert doc.grain_type.generation == 4
    assert doc.grain_types == ["carts"]
    assert doc.strategy.name == "ResourceOptimized"
    assert not doc.default


def test_overloaded_applies_the_grain_types_thresholds() -> None:
    loose = graintype(loadShedding={"cpuThreshold": 99})
    strict = graintype(loadShedding={"cpuThreshold": 80, "memoryThreshold": 50})
    off = graintype(loadShedding={"enabled": False})
    hot = {"w-0": stats(cpu_usage=90.0)}
    said_so = {"w-0": stats(overloaded=True)}

    def flag(gt, s):
        return build_document(gt, [pod(0)], s, version=1, now=NOW).members[0].stats

    assert not flag(loose, hot).overloaded
    assert flag(strict, hot).overloaded
    assert not flag(off, hot).overloaded
    assert flag(off, said_so).overloaded, "a member's own flag counts even when disabled"
    assert flag(strict, {"w-0": stats(memory_usage=50.5)}).overloaded


def test_default_graintype_counts_every_activation() -> None:
    assert counted_grain_types(graintype("carts", grainTypes=["A", "B"])) == ["A", "B"]
    assert counted_grain_types(graintype("carts")) == ["carts"]
    assert counted_grain_types(graintype("default")) is None
    assert build_document(graintype("default"), [], {}, version=1, now=NOW).default


# ---------------------------------------------------------------------------------- the gate


def load_doc(cpu: float, version: int = 1, members=(0, 1)):
    pods = [pod(i) for i in members]
    return build_document(
        graintype(), pods, {p.name: stats(cpu_usage=cpu) for p in pods}, version=version, now=NOW
    )


def consider(gate: PublishGate, doc, now: float):
    return gate.consider(doc, now, min_interval=2.0, hysteresis_percent=5)


def test_gate_writes_first_table_and_membership_at_once() -> None:
    gate = PublishGate()
    first = consider(gate, load_doc(10), 0.0)
    assert first.write
    assert first.change.kind is ChangeKind.SPEC
    gate.written(load_doc(10), 0.0)
    left = consider(gate, load_doc(10, members=(0,)), 0.1)
    assert left.write
    assert left.change.kind is ChangeKind.MEMBERSHIP


def test_gate_holds_load_changes_until_min_interval() -> None:
    gate = PublishGate()
    gate.written(load_doc(10), 100.0)
    assert consider(gate, load_doc(14), 100.5).change.kind is ChangeKind.NONE
    held = consider(gate, load_doc(20), 100.5)
    assert not held.write
    assert held.retry_in == pytest.approx(1.5)
    assert consider(gate, load_doc(20), 102.0).write


def test_gate_compares_with_the_last_written_table() -> None:
    gate = PublishGate()
    gate.written(load_doc(10), 0.0)
    # 4 points at a time never crosses 5 between neighbours, but does against what was written.
    assert not consider(gate, load_doc(14), 10.0).write
    assert consider(gate, load_doc(18), 20.0).write


def test_versions_continue_past_the_published_and_the_status() -> None:
    assert PublishGate().next_version == 1
    assert PublishGate(load_doc(10, version=7)).next_version == 8
    assert PublishGate(load_doc(10, version=7), version_floor=12).next_version == 13


def test_a_resumed_gate_writes_nothing_that_did_not_change() -> None:
    gate = PublishGate(load_doc(10, version=7))
    assert not consider(gate, load_doc(11, version=8), 0.0).write
    assert consider(gate, load_doc(30, version=8), 0.0).write, "no write yet: not held back"


# ------------------------------------------------------------------------------------ status


def status_of(gt, selected, doc, **kw):
    found = problems(gt, selected, doc, **kw)
    return found, build_status(
        gt, selected, doc, found, conditions=[], now=NOW, last_publish_time="T"
    )


def condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_ready_status_counts_and_columns() -> None:
    gt = graintype()
    members = [pod(0), pod(1)]
    hot = {"w-0": stats(cpu_usage=99.0), "w-1": stats()}
    doc = build_document(gt, members, hot, version=3, now=NOW)
    found, status = status_of(gt, [*members, pod(2, ready=False)], doc)
    assert found == []
    assert status["members"] == 3
    assert status["compatibleMembers"] == 2
    assert status["overloadedMembers"] == 1
    assert status["tableVersion"] == 3
    assert status["placementTable"] == "carts-placement"
    assert status["observedGeneration"] == 4
    assert condition(status, "Ready")["status"] == "True"
    assert condition(status, "Ready")["reason"] == "Published"
    assert condition(status, "Degraded")["status"] == "False"


@pytest.mark.parametrize(
    ("selected", "stats_of", "strategy", "reason", "ready"),
    [
        ([], {}, "Random", "NoMembers", "False"),
        ([pod(0, ready=False)], {}, "Random", "NoCompatibleMembers", "False"),
        ([pod(0)], {"w-0": stats(cpu_usage=99.0)}, "Random", "AllMembersOverloaded", "True"),
        ([pod(0)], {}, "ActivationCountBased", "NoStatistics", "True"),
    ],
)
def test_degraded_reasons(selected, stats_of, strategy, reason, ready) -> None:
    gt = graintype(strategy={"name": strategy})
    members = [p for p in selected if is_compatible(p)]
    doc = build_document(gt, members, stats_of, version=1, now=NOW)
    found, status = status_of(gt, selected, doc)
    assert found[0].reason == reason
    assert condition(status, "Degraded")["status"] == "True"
    assert condition(status, "Degraded")["reason"] == reason
    assert condition(status, "Ready")["status"] == ready


def test_random_without_statistics_is_not_degraded() -> None:
    gt = graintype(strategy={"name": "HashBased"})
    doc = build_document(gt, [pod(0)], {}, version=1, now=NOW)
    assert problems(gt, [pod(0)], doc) == []


def test_conflicts_and_publish_failures_are_reported() -> None:
    gt = graintype()
    doc = build_document(gt, [pod(0)], {"w-0": stats()}, version=1, now=NOW)
    found, status = status_of(gt, [pod(0)], doc, conflicts={"carts": ["b-carts"], "x": []})
    assert [p.reason for p in found] == ["GrainTypeConflict"]
    assert "'carts' also claimed by b-carts" in condition(status, "Degraded")["message"]
    assert condition(status, "Ready")["status"] == "True"
    found, status = status_of(gt, [pod(0)], doc, error="table too large")
    assert condition(status, "Ready")["reason"] == "PublishFailed"


def test_conflicts_name_the_other_graintypes_claiming_a_grain_type() -> None:
    claims = {
        "carts": claimed_grain_types({"metadata": {"name": "carts"}, "spec": {}}),
        "shop": claimed_grain_types(
            {"metadata": {"name": "shop"}, "spec": {"grainTypes": ["carts", "orders"]}}
        ),
        "legacy": ("orders", "carts"),
        "other": ("users",),
    }
    assert claims["carts"] == ("carts",), "without grainTypes it places its own name"
    assert conflicts("shop", ["carts", "orders"], claims) == {
        "carts": ["carts", "legacy"],
        "orders": ["legacy"],
    }
    assert conflicts("other", ["users"], claims) == {}
