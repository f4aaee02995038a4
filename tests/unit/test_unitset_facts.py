"""What the unit-set controller reads and how it names things: pod facts from Pod objects,
member selection, rollout detection from workloads and revision hashes, the spec → strategy
translation, and the assignment ConfigMap's name."""

from __future__ import annotations

from typing import Any

import pytest

from apportion.api import PartitionSet, ShardSet
from apportion.api.assignment import ResourceRef, assignment_config_map
from apportion.api.common import LabelSelector
from apportion.api.pods import WorkerPod
from apportion.controllers.pods import pods_of, select
from apportion.controllers.workloads import WorkloadFact, rollout_of
from apportion.engine.allocation import (
    Balanced,
    BalancedParameters,
    ConsistentHashing,
    ConsistentHashingParameters,
    External,
    LeastShards,
    LeastShardsParameters,
    from_spec,
)
from apportion.engine.allocation.from_spec import move_budget, strategy_for
from apportion.engine.set_pass import (
    NEW_REVISION,
    OLD_REVISION,
    PassInput,
    Rollout,
    engine_members,
    initial_table,
)
from tests.support.present import present


def pod_body(name: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "app": "w",
                "controller-revision-hash": "w-1",
                "statefulset.kubernetes.io/pod-name": name,
            },
            "annotations": {},
        },
        "spec": {
            "containers": [{"name": "c", "ports": [{"name": "metrics", "containerPort": 8080}]}]
        },
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.9",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for path, value in changes.items():
        section, key = path.split("__")
        body[section][key] = value
    return body


def test_pod_facts() -> None:
    fact = WorkerPod.from_body(pod_body("w-0"))
    assert (fact.name, fact.uid, fact.ready, fact.terminating, fact.terminal) == (
        "w-0",
        "uid-w-0",
        True,
        False,
        False,
    )
    assert fact.revision == "w-1"
    assert fact.ip == "127.0.0.9"
    assert fact.ports == {"metrics": 8080}

    annotations = {
        "apportion.dev/ack.partitionset.demo": '{"uid":"x","epoch":1}',
        "controller.kubernetes.io/pod-deletion-cost": "8",
        "other": "y",
    }
    fact = WorkerPod.from_body(
        pod_body(
            "w-1",
            metadata__annotations=annotations,
            metadata__deletionTimestamp="2026-01-01T00:01:00Z",
        )
    )
    assert fact.terminating
    assert fact.deletion_cost == "8"
    assert fact.acks == {"apportion.dev/ack.partitionset.demo": '{"uid":"x","epoch":1}'}
    mine = fact.for_set("apportion.dev/ack.partitionset.demo")
    assert mine.acks == {"apportion.dev/ack.partitionset.demo": '{"uid":"x","epoch":1}'}
    assert mine.deletion_cost is None  # the operator's own write is no change to a set
    assert fact.for_set("apportion.dev/ack.shardset.demo").acks == {}

    unready = WorkerPod.from_body(pod_body("w-2", status__conditions=[]))
    failed = WorkerPod.from_body(pod_body("w-3", status__phase="Failed"))
    assert not unready.ready
    assert failed.terminal
    assert fact.ready_since == ""
    assert unready.ready_since == ""
    turned = [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:30Z"}]
    was = [{"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:30Z"}]
    assert WorkerPod.from_body(pod_body("w-4", status__conditions=turned)).ready_since == (
        "2026-01-01T00:00:30Z"
    )
    assert WorkerPod.from_body(pod_body("w-5", status__conditions=was)).ready_since == ""
    deployment = WorkerPod.from_body(pod_body("d-0", metadata__labels={"pod-template-hash": "a"}))
    assert deployment.revision == "a"


def test_selection_and_terminated_pods() -> None:
    facts = [WorkerPod.from_body(pod_body(f"w-{i}")) for i in range(3)]
    facts.append(WorkerPod.from_body(pod_body("x", metadata__labels={"app": "x"})))
    facts.append(WorkerPod.from_body(pod_body("done", status__phase="Succeeded")))
    assert [p.name for p in pods_of(facts)] == ["w-0", "w-1", "w-2", "x"]
    assert pods_of([]) == []
    app_w = LabelSelector.model_validate({"matchLabels": {"app": "w"}})
    not_w1 = LabelSelector.model_validate(
        {
            "matchExpressions": [
                {
                    "key": "statefulset.kubernetes.io/pod-name",
                    "operator": "NotIn",
                    "values": ["w-1"],
                }
            ]
        }
    )
    assert [p.name for p in select(facts[:4], app_w)] == ["w-0", "w-1", "w-2"]
    assert [p.name for p in select(facts[:4], app_w, None, not_w1)] == ["w-0", "w-2"]


def member(name: str, revision: str, created: str = "2026-01-01T00:00:00Z") -> WorkerPod:
    return WorkerPod(name, f"uid-{name}", revision=revision, created=created)


def statefulset(current: str, update: str) -> WorkloadFact:
    return WorkloadFact("StatefulSet", "w", {"matchLabels": {"app": "w"}}, 3, 3, 3, current, update)


def test_statefulset_rollout() -> None:
    settled = rollout_of(statefulset("w-1", "w-1"), [member("w-0", "w-1")])
    assert not settled.rolling
    assert settled.new_revision == "w-1"
    rolling = rollout_of(
        statefulset("w-1", "w-2"),
        [member("w-0", "w-1"), member("w-1", "w-1"), member("w-2", "w-2")],
    )
    assert rolling.rolling
    assert rolling.new_revision == "w-2"
    assert rolling.message == "StatefulSet w: 1 of 3 member(s) at revision w-2"


def test_deployment_and_bare_pod_rollouts() -> None:
    deployment = WorkloadFact("Deployment", "d", {}, 2, 3, 1)
    pods = [
        member("d-a", "old", "2026-01-01T00:00:00Z"),
        member("d-b", "new", "2026-01-01T00:05:00Z"),
    ]
    rolling = rollout_of(deployment, pods)
    assert rolling.rolling
    assert rolling.new_revision == "new"
    done = WorkloadFact("Deployment", "d", {}, 2, 2, 2)
    assert not rollout_of(done, [member("d-b", "new")]).rolling
    assert rollout_of(None, pods).rolling
    assert rollout_of(None, pods).new_revision == "new"
    assert not rollout_of(None, [member("p", "")]).rolling


def test_workload_selector() -> None:
    assert present(statefulset("a", "a").label_selector(), "selector").matches({"app": "w"})
    assert WorkloadFact("StatefulSet", "w", {"matchLabels": {}}).label_selector() is None


def test_members_of_older_revisions_rank_lower_during_a_rollout() -> None:
    spec = PartitionSet.model_validate(
        {"spec": {"partitions": 4, "selector": {"matchLabels": {"app": "w"}}}}
    ).spec
    pods = [WorkerPod("w-10", "u10", revision="new"), WorkerPod("w-2", "u2", revision="old")]
    table = initial_table(ResourceRef("PartitionSet", "ns", "p", "u"), spec, 1)
    inp = PassInput(spec, table, 1, pods, now=0.0, rollout=Rollout(True, "new", "rolling"))
    members, problems = engine_members(inp, {})
    assert [(m.name, m.version) for m in members] == [("w-2", OLD_REVISION), ("w-10", NEW_REVISION)]
    assert problems == []


def spec_of(kind: type[PartitionSet] | type[ShardSet], **spec: Any) -> Any:
    field = "partitions" if kind is PartitionSet else "shards"
    body = {field: 100, "selector": {"matchLabels": {"app": "w"}}, **spec}
    return kind.model_validate({"spec": body}).spec


def test_balanced_translation() -> None:
    spec = spec_of(
        PartitionSet,
        rebalance={"imbalanceTolerance": "5%", "maxMovesPerRound": "10%"},
        topologySpread={"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 2},
    )
    strategy = strategy_for(spec)
    assert isinstance(strategy, Balanced)
    assert strategy.options == BalancedParameters(
        tolerance=0.05,
        max_moves=10,
        max_moved_load_percent=10.0,
        topology_key="topology.kubernetes.io/zone",
        max_skew=2,
    )
    without_budget = strategy_for(spec, budget=0)
    assert isinstance(without_budget, Balanced)
    assert without_budget.options.max_moves == 0


def test_least_shards_percent_becomes_a_fraction() -> None:
    spec = spec_of(
        ShardSet, strategy={"name": "LeastShards", "leastShards": {"relativeLimitPercent": 5}}
    )
    strategy = strategy_for(spec)
    assert isinstance(strategy, LeastShards)
    assert strategy.options == LeastShardsParameters(absolute_limit=20, relative_limit=0.05)
    assert strategy.limit(1000) == 20


def test_consistent_hashing_and_external_with_its_fallback_options() -> None:
    hashing = spec_of(ShardSet, strategy={"name": "ConsistentHashing"})
    ring = strategy_for(hashing)
    assert isinstance(ring, ConsistentHashing)
    assert ring.options == ConsistentHashingParameters(virtual_nodes=10, rebalance_limit=0)
    external = spec_of(
        ShardSet,
        strategy={
            "name": "External",
            "external": {"pins": [{"unit": 7, "member": "w-0"}], "fallback": "LeastShards"},
            "leastShards": {"absoluteLimit": 5},
        },
    )
    pinned = strategy_for(external)
    assert isinstance(pinned, External)
    assert pinned.pins == {"7": "w-0"}
    assert isinstance(pinned.fallback, LeastShards)
    assert pinned.fallback.options == LeastShardsParameters(absolute_limit=5, relative_limit=0.1)


def test_custom_strategy_by_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = spec_of(
        ShardSet,
        strategy={"name": "Custom", "custom": {"entryPoint": "mine", "parameters": {"k": "v"}}},
    )
    asked: list[Any] = []
    monkeypatch.setattr(from_spec, "make_strategy", lambda mapping: asked.append(mapping))
    strategy_for(spec)
    assert asked == [{"name": "mine", "k": "v"}]


@pytest.mark.parametrize(
    ("value", "units", "budget"), [("25%", 32, 8), ("25%", 30, 8), (3, 1000, 3), ("0%", 10, 0)]
)
def test_move_budget(value: Any, units: int, budget: int) -> None:
    spec = spec_of(ShardSet, rebalance={"maxMovesPerRound": value})
    assert move_budget(spec.rebalance, units) == budget


def test_config_map_names() -> None:
    assert assignment_config_map("PartitionSet", "demo") == "demo-partitionset-assignment"
    assert assignment_config_map("ShardSet", "demo") == "demo-shardset-assignment"
    long_a = assignment_config_map("ShardSet", "a" * 240 + "x")
    long_b = assignment_config_map("ShardSet", "a" * 240 + "y")
    assert long_a != long_b
    assert len(long_a) <= 221
    assert len(long_b) <= 221


def test_one_fact_per_pod_name() -> None:
    old = WorkerPod("w-1", "old-uid", created="2026-01-01T00:00:00Z")
    new = WorkerPod("w-1", "new-uid", created="2026-01-01T00:09:00Z")
    other = WorkerPod("w-0", "uid-0", created="2026-01-01T00:00:00Z")
    assert {p.uid for p in pods_of([old, new, other])} == {"new-uid", "uid-0"}
