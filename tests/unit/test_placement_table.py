"""The placement-table wire format: round trips, ConfigMap shape, errors, and the hysteresis rule
that decides which changes are published."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.api.graintype import GrainStrategySpec, LoadShedding, PlacementFilter
from apportion.api.placement_table import (
    DATA_KEY,
    TABLE_LABEL,
    VERSION_ANNOTATION,
    ChangeKind,
    GrainTypeRef,
    PlacementTableDocument,
    PlacementTableFormatError,
    TableMember,
    TableStats,
    classify_change,
    configmap_name,
    from_configmap,
    to_configmap,
)
from apportion.engine.grains import (
    PlacementContext,
    PlacementTable,
    make_grain_strategy,
)
from tests.support.present import present

GIB = 1 << 30


def stats(**kw) -> TableStats:
    base = {
        "cpu_usage": 40.0,
        "memory_usage": 30.0,
        "available_memory": 3 * GIB,
        "max_available_memory": 4 * GIB,
        "activation_count": 100,
        "cpu_count": 2,
    }
    return TableStats(**{**base, **kw})


def doc(members=None, **kw) -> PlacementTableDocument:
    values = {
        "grain_type": GrainTypeRef(namespace="shop", name="carts", uid="uid-1", generation=2),
        "grain_types": ["Shop.CartGrain"],
        "version": 7,
        "published_at": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        "strategy": GrainStrategySpec(name="ActivationCountBased"),
        "filters": [PlacementFilter(type="RequiredMatch", keys=["zone"])],
        "load_shedding": LoadShedding(),
        "members": members
        if members is not None
        else [
            TableMember(name="w-0", address="127.0.0.10", labels={"zone": "a"}, stats=stats()),
            TableMember(name="w-1", labels={"zone": "b"}, stats=stats(activation_count=80)),
            TableMember(name="w-2", labels={"zone": "a"}),
        ],
    }
    values.update(kw)
    return PlacementTableDocument(**values)


def test_document_round_trips_through_a_configmap() -> None:
    original = doc()
    cm = to_configmap(original)
    assert cm["metadata"]["name"] == "carts-placement"
    assert cm["metadata"]["namespace"] == "shop"
    assert cm["metadata"]["labels"][TABLE_LABEL] == "true"
    assert cm["metadata"]["annotations"][VERSION_ANNOTATION] == "7"
    owner = cm["metadata"]["ownerReferences"][0]
    assert owner == {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "GrainType",
        "name": "carts",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    # The API server hands data back as plain strings: go through JSON like it would.
    parsed = from_configmap(json.loads(json.dumps(cm)))
    assert parsed == original
    assert parsed.members[2].stats is None, "a member that has not reported stays unknown"


def test_wire_form_is_camel_case_and_omits_unknowns() -> None:
    data = json.loads(to_configmap(doc())["data"][DATA_KEY])
    assert data["kind"] == "PlacementTable"
    assert data["grainType"] == {
        "namespace": "shop",
        "name": "carts",
        "uid": "uid-1",
        "generation": 2,
    }
    assert data["loadShedding"] == {"enabled": True, "cpuThreshold": 95, "memoryThreshold": 90}
    assert data["members"][0]["stats"]["maxAvailableMemory"] == 4 * GIB
    assert "stats" not in data["members"][2]
    assert "address" not in data["members"][1]
    assert data["publishedAt"] == "2025-01-02T03:04:05Z"


def test_the_engine_reads_the_document_as_published() -> None:
    data = json.loads(doc().to_json())
    table = PlacementTable.from_dict(data)
    assert table.names == ("w-0", "w-1", "w-2")
    assert table.version == "7"
    assert table.activation_counts == (100, 80, 0)
    strategy = make_grain_strategy(data["strategy"], data["filters"])
    strategy.update(table)
    # RequiredMatch(zone) from w-0 keeps w-0 and w-2; w-2 has no statistics, so w-0.
    assert strategy.place("cart/1", PlacementContext(local_member="w-0")) == "w-0"


def test_future_fields_are_ignored() -> None:
    data = json.loads(doc().to_json())
    data["somethingNew"] = {"x": 1}
    data["members"][0]["zoneWeight"] = 3
    assert PlacementTableDocument.from_json(json.dumps(data)) == doc()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("members"), "members: Field required"),
        (lambda d: d.update(version=-1), "version: Input should be greater than or equal to 0"),
        (lambda d: d.update(kind="Assignment"), "kind: Input should be 'PlacementTable'"),
        (lambda d: d["members"].reverse(), "members must be sorted by name and unique"),
        (lambda d: d["members"].append(d["members"][-1]), "members must be sorted"),
        (lambda d: d["members"][0]["stats"].update(cpuCount=0), "cpuCount"),
        (lambda d: d["strategy"].update(name="Nearest"), "strategy.name"),
    ],
)
def test_bad_documents_name_the_field(mutate, message) -> None:
    data = json.loads(doc().to_json())
    mutate(data)
    cm = {"metadata": {"name": "carts-placement"}, "data": {DATA_KEY: json.dumps(data)}}
    with pytest.raises(PlacementTableFormatError, match="carts-placement") as error:
        from_configmap(cm)
    assert message in str(error.value)


def test_missing_data_key_and_bad_json() -> None:
    with pytest.raises(PlacementTableFormatError, match=r"has no 'placement\.json' key"):
        from_configmap({"metadata": {"name": "x"}, "data": {}})
    with pytest.raises(PlacementTableFormatError, match="Invalid JSON"):
        from_configmap({"metadata": {"name": "x"}, "data": {DATA_KEY: "{nope"}})


def test_a_table_too_large_for_a_configmap_is_refused() -> None:
    members = [
        TableMember(name=f"w-{i:05d}", labels={f"k{j}": "v" * 60 for j in range(8)})
        for i in range(2000)
    ]
    with pytest.raises(PlacementTableFormatError, match="a ConfigMap holds at most"):
        to_configmap(doc(members=members))


def test_configmap_names_stay_valid_and_distinct() -> None:
    assert configmap_name("users") == "users-placement"
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    assert len(configmap_name(long_a)) <= 253
    assert configmap_name(long_a) != configmap_name(long_b)
    assert configmap_name(long_a).endswith("-placement")


# --------------------------------------------------------------------------------- hysteresis


def with_stats(base: PlacementTableDocument, name: str, **kw) -> PlacementTableDocument:
    members = [
        m.model_copy(update={"stats": present(m.stats, name).model_copy(update=kw)})
        if m.name == name
        else m
        for m in base.members
    ]
    return base.model_copy(update={"members": members})


def test_first_table_and_spec_changes_are_urgent() -> None:
    assert classify_change(None, doc(), 5).kind is ChangeKind.SPEC
    changed = doc(strategy=GrainStrategySpec(name="Random"))
    assert classify_change(doc(), changed, 5).kind is ChangeKind.SPEC
    assert classify_change(doc(), doc(filters=[]), 5).urgent
    assert classify_change(doc(), doc(load_shedding=LoadShedding(cpu_threshold=80)), 5).urgent


def test_membership_changes_are_urgent_and_say_who() -> None:
    base = doc()
    left = base.model_copy(update={"members": base.members[:2]})
    change = classify_change(base, left, 5)
    assert change.kind is ChangeKind.MEMBERSHIP
    assert "left ['w-2']" in change.reason
    joined = classify_change(left, base, 5)
    assert joined.kind is ChangeKind.MEMBERSHIP
    assert "joined ['w-2']" in joined.reason
    relabelled = base.model_copy(
        update={
            "members": [
                base.members[0].model_copy(update={"labels": {"zone": "c"}}),
                *base.members[1:],
            ]
        }
    )
    assert classify_change(base, relabelled, 5).kind is ChangeKind.MEMBERSHIP


def test_load_within_the_hysteresis_is_not_published() -> None:
    base = doc()
    assert classify_change(base, base, 5).kind is ChangeKind.NONE
    assert classify_change(base, with_stats(base, "w-0", cpu_usage=44.9), 5).kind is ChangeKind.NONE
    assert classify_change(base, with_stats(base, "w-0", activation_count=104), 5).kind == 0
    # Only the published copy counts: the time of publication is not a change.
    later = base.model_copy(update={"published_at": datetime.now(UTC), "version": 8})
    assert classify_change(base, later, 5).kind is ChangeKind.NONE


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpu_usage", 45.1),
        ("memory_usage", 24.0),
        ("available_memory", 2 * GIB),
        ("max_available_memory", 5 * GIB),
        ("activation_count", 106),
        ("cpu_count", 3),
        ("overloaded", True),
    ],
)
def test_load_beyond_the_hysteresis_is_a_load_change(field, value) -> None:
    change = classify_change(doc(), with_stats(doc(), "w-0", **{field: value}), 5)
    assert change.kind is ChangeKind.LOAD
    assert change.reason.startswith("w-0")


def test_reporting_for_the_first_time_is_a_load_change() -> None:
    base = doc()
    reported = base.model_copy(
        update={
            "members": [*base.members[:2], base.members[2].model_copy(update={"stats": stats()})]
        }
    )
    change = classify_change(base, reported, 5)
    assert change.kind is ChangeKind.LOAD
    assert change.reason == "w-2 reported"


@given(
    old=st.floats(0, 100),
    new=st.floats(0, 100),
    hysteresis=st.integers(0, 100),
)
def test_cpu_hysteresis_is_in_points_of_the_range(old, new, hysteresis) -> None:
    before = with_stats(doc(), "w-1", cpu_usage=old)
    after = with_stats(doc(), "w-1", cpu_usage=new)
    kind = classify_change(before, after, hysteresis).kind
    assert (kind is ChangeKind.LOAD) == (abs(new - old) * 100 > hysteresis * 100)


@given(old=st.integers(0, 10_000), new=st.integers(0, 10_000), hysteresis=st.integers(0, 100))
def test_count_hysteresis_is_relative(old, new, hysteresis) -> None:
    before = with_stats(doc(), "w-1", activation_count=old)
    after = with_stats(doc(), "w-1", activation_count=new)
    kind = classify_change(before, after, hysteresis).kind
    assert (kind is ChangeKind.LOAD) == (abs(new - old) * 100 > hysteresis * max(old, new, 1))
