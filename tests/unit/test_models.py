"""The API models: defaults, wire names, typed scalars, selectors, conditions, parsing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from apportion.api import (
    ConditionStatus,
    GrainType,
    PartitionSet,
    ShardSet,
    parse_resource,
    set_condition,
)
from apportion.api.common import (
    LabelSelector,
    ScrapeSpec,
    format_duration,
    parse_duration,
    scaled_value,
)
from apportion.api.conditions import dump_conditions, find_condition, is_true
from apportion.api.graintype import GrainStrategyName, ResourceOptimizedOptions
from apportion.api.unitset import (
    KeySchemeName,
    LeastShardsOptions,
    MemberUnits,
    RebalancePolicy,
    UnitSetStatus,
    UnitStrategy,
    UnitStrategyName,
)
from tests.support.present import present

SELECTOR = {"matchLabels": {"app": "workers"}}


def raw(kind: str, spec: dict) -> dict:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "ns", "generation": 3},
        "spec": spec,
    }


def test_partitionset_defaults() -> None:
    pset = PartitionSet.from_raw(raw("PartitionSet", {"partitions": 32, "selector": SELECTOR}))
    spec = pset.spec
    assert spec.units == 32
    assert spec.key_scheme is KeySchemeName.NETHERITE
    assert spec.strategy.name is UnitStrategyName.BALANCED
    assert spec.rebalance.interval == timedelta(seconds=10)
    assert spec.rebalance.handoff_timeout == timedelta(seconds=60)
    assert spec.rebalance.max_moves_per_round == "25%"
    assert spec.rebalance.pause_during_rollout is True
    assert spec.rebalance.tolerance() == pytest.approx(0.10)
    assert spec.metrics.pod_metrics is True
    assert spec.metrics.scrape is None
    assert spec.metrics.smoothing.half_life == timedelta(seconds=30)
    assert spec.topology_spread is None
    assert pset.metadata.generation == 3
    assert pset.status is None


def test_shardset_defaults_to_akka_keys() -> None:
    sset = ShardSet.from_raw(raw("ShardSet", {"shards": 1000, "selector": SELECTOR}))
    assert sset.spec.key_scheme is KeySchemeName.AKKA
    assert sset.spec.units == 1000


def test_graintype_defaults_are_orleans_resource_optimized() -> None:
    gtype = GrainType.from_raw(raw("GrainType", {"selector": SELECTOR}))
    spec = gtype.spec
    assert spec.strategy.name is GrainStrategyName.RESOURCE_OPTIMIZED
    weights = spec.strategy.options()
    assert isinstance(weights, ResourceOptimizedOptions)
    assert (
        weights.cpu_usage,
        weights.memory_usage,
        weights.available_memory,
        weights.max_available_memory,
        weights.activation_count,
        weights.local_silo_preference_margin,
    ) == (40, 20, 20, 5, 15, 5)
    assert (spec.load_shedding.cpu_threshold, spec.load_shedding.memory_threshold) == (95, 90)
    assert spec.publish.interval == timedelta(seconds=1)
    assert gtype.grain_type_names() == ["x"]


def test_wire_names_are_camel_case_and_round_trip() -> None:
    body = raw(
        "ShardSet",
        {
            "shards": 100,
            "workloadRef": {"kind": "StatefulSet", "name": "w"},
            "strategy": {"name": "LeastShards", "leastShards": {"absoluteLimit": 5}},
            "rebalance": {"handoffTimeout": "90s", "maxMovesPerRound": 3},
            "topologySpread": {"topologyKey": "topology.kubernetes.io/zone", "maxSkew": 2},
            "metrics": {"scrape": {"port": "metrics"}},
        },
    )
    sset = ShardSet.from_raw(body)
    assert sset.spec.workload_ref is not None
    assert sset.spec.workload_ref.name == "w"
    wire = sset.to_json_dict()
    assert wire["spec"]["strategy"] == {
        "name": "LeastShards",
        "leastShards": {"absoluteLimit": 5, "relativeLimitPercent": 10},
    }
    assert wire["spec"]["rebalance"]["handoffTimeout"] == "90s"
    assert wire["spec"]["topologySpread"] == {
        "topologyKey": "topology.kubernetes.io/zone",
        "maxSkew": 2,
    }
    assert ShardSet.from_raw(wire) == sset


def test_python_names_are_accepted_too() -> None:
    policy = RebalancePolicy(max_moves_per_round=4, handoff_timeout="2m")
    assert policy.handoff_timeout == timedelta(minutes=2)
    assert policy.to_json_dict()["maxMovesPerRound"] == 4


def test_strategy_options_fill_defaults_for_the_chosen_name() -> None:
    strategy = UnitStrategy(name="LeastShards")
    assert strategy.options() == LeastShardsOptions(absolute_limit=20, relative_limit_percent=10)
    assert strategy.options(UnitStrategyName.CONSISTENT_HASHING).virtual_nodes == 10
    assert UnitStrategy(name="Custom").options() is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10), ("1m30s", 90), ("250ms", 0.25), ("1h", 3600), ("1.5s", 1.5), ("2h3m", 7380)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10", "soon", "1d", "-1s", "1 s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**12))
def test_duration_text_round_trips(micros: int) -> None:
    value = timedelta(microseconds=micros)
    assert parse_duration(format_duration(value)) == value


@pytest.mark.parametrize(
    ("value", "total", "expected"), [(3, 100, 3), ("25%", 32, 8), ("10%", 33, 4), ("0%", 9, 0)]
)
def test_scaled_value(value: int | str, total: int, expected: int) -> None:
    assert scaled_value(value, total) == expected


@pytest.mark.parametrize("value", [-1, "101%", "ten", "5"])
def test_int_or_percent_rejects(value: int | str) -> None:
    with pytest.raises(ValidationError):
        RebalancePolicy(max_moves_per_round=value)


@pytest.mark.parametrize(("value", "fraction"), [("Tight", 0.025), ("Loose", 0.4), ("5%", 0.05)])
def test_imbalance_tolerance(value: str, fraction: float) -> None:
    assert RebalancePolicy(imbalance_tolerance=value).tolerance() == pytest.approx(fraction)


def test_imbalance_tolerance_rejects_unknown_words() -> None:
    with pytest.raises(ValidationError, match="Tight, Default, Loose"):
        RebalancePolicy(imbalance_tolerance="Medium")


@pytest.mark.parametrize("port", [0, 70000, "Metrics", "a-very-long-port-name"])
def test_scrape_port_rejects(port: int | str) -> None:
    with pytest.raises(ValidationError):
        ScrapeSpec(port=port)


def test_decimal_is_a_string_on_the_wire() -> None:
    status = UnitSetStatus(
        imbalance=1.0234,
        member_units=[MemberUnits(member="p-0", units=8, load=12.5)],
        conditions=[],
    )
    wire = status.to_json_dict()
    assert wire["imbalance"] == "1.02"
    assert wire["memberUnits"] == [{"member": "p-0", "units": 8, "load": "12.50"}]
    assert UnitSetStatus.model_validate(wire).imbalance == pytest.approx(1.02)


def test_label_selector_query_and_matching() -> None:
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"app": "w", "tier": "x"},
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a", "b"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "role", "operator": "Exists"},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
            ],
        }
    )
    assert selector.to_query() == "app=w,tier=x,zone in (a,b),!legacy,role,env notin (dev)"
    base = {"app": "w", "tier": "x", "zone": "a", "role": "r"}
    assert selector.matches(base)
    assert not selector.matches({**base, "zone": "c"})
    assert not selector.matches({**base, "legacy": "1"})
    assert not selector.matches({k: v for k, v in base.items() if k != "role"})
    assert not selector.matches({**base, "env": "dev"})
    assert selector.matches({**base, "env": "prod"})


def test_parse_resource_dispatches_on_kind() -> None:
    obj = parse_resource(raw("GrainType", {"selector": SELECTOR}))
    assert isinstance(obj, GrainType)
    with pytest.raises(ValueError, match="not an apportion object"):
        parse_resource({"apiVersion": "v1", "kind": "ConfigMap"})


def test_missing_count_is_rejected() -> None:
    with pytest.raises(ValidationError, match="partitions"):
        PartitionSet.from_raw(raw("PartitionSet", {"selector": SELECTOR}))


T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_set_condition_appends_a_new_condition() -> None:
    result = set_condition(None, type_="Ready", status=True, reason="Accepted", now=T0)
    assert [(c.type, c.status, c.last_transition_time) for c in result] == [
        ("Ready", ConditionStatus.TRUE, T0)
    ]


def test_transition_time_moves_only_when_status_changes() -> None:
    first = set_condition(
        None, type_="Ready", status=True, reason="Accepted", observed_generation=1, now=T0
    )
    same = set_condition(
        dump_conditions(first),
        type_="Ready",
        status=True,
        reason="Placed",
        message="8 units each",
        observed_generation=2,
        now=T1,
    )
    (ready,) = same
    assert ready.last_transition_time == T0
    assert (ready.reason, ready.message, ready.observed_generation) == ("Placed", "8 units each", 2)
    flipped = set_condition(same, type_="Ready", status=False, reason="NoMembers", now=T1)
    assert flipped[0].last_transition_time == T1
    assert flipped[0].status is ConditionStatus.FALSE


def test_set_condition_keeps_others_and_their_order() -> None:
    conditions = set_condition(None, type_="Ready", status=True, reason="A", now=T0)
    conditions = set_condition(conditions, type_="Balanced", status=False, reason="B", now=T0)
    before = list(conditions)
    after = set_condition(conditions, type_="Ready", status=False, reason="C", now=T1)
    assert [c.type for c in after] == ["Ready", "Balanced"]
    assert after[1] == before[1]
    assert conditions == before, "the input list is not modified"
    assert is_true(after, "Ready") is False
    assert present(find_condition(after, "Balanced"), "Balanced").reason == "B"


def test_condition_wire_form() -> None:
    (wire,) = dump_conditions(
        set_condition(None, type_="Ready", status=True, reason="Ok", observed_generation=4, now=T0)
    )
    assert wire == {
        "type": "Ready",
        "status": "True",
        "reason": "Ok",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 4,
    }


def test_condition_reason_must_be_camel_case() -> None:
    with pytest.raises(ValidationError):
        set_condition(None, type_="Ready", status=True, reason="not ok", now=T0)


def test_compact_wire_form_and_full_patch_form() -> None:
    status = UnitSetStatus(members=0, observed_generation=2, conditions=[])
    assert status.to_json_dict() == {"observedGeneration": 2, "members": 0}
    full = status.model_dump(mode="json")
    assert full["memberUnits"] == [], (
        "a merge patch built from model_dump clears stale rows and values"
    )
    assert full["imbalance"] is None, (
        "a merge patch built from model_dump clears stale rows and values"
    )
