"""PlacementDirector offline: tables given by hand, every strategy through the engine, the
`default` GrainType, optimistic increments across table versions, and its counters."""

from __future__ import annotations

import random
import threading
from collections import Counter
from datetime import UTC, datetime

import pytest

from apportion.api.graintype import GrainStrategySpec, LoadShedding, PlacementFilter
from apportion.api.placement_table import (
    GrainTypeRef,
    PlacementTableDocument,
    TableMember,
    TableStats,
)
from apportion.engine.grains import (
    NoCompatibleMember,
    PlacementError,
    StatelessWorkerAtCapacity,
)
from apportion.grains import NoPlacementTable, PlacementDirector
from tests.support.present import present

ZONES = "aabbccdd"


def members(counts=None, overloaded=(), **kw) -> list[TableMember]:
    counts = counts or [0] * 8
    return [
        TableMember(
            name=f"w-{i}",
            labels={"zone": f"zone-{ZONES[i]}", "apportion.dev/role": "web" if i < 4 else "batch"},
            stats=TableStats(
                cpu_usage=97.0 if f"w-{i}" in overloaded else 20.0,
                memory_usage=30.0,
                available_memory=3 << 30,
                max_available_memory=4 << 30,
                activation_count=count,
                cpu_count=2,
                overloaded=f"w-{i}" in overloaded,
            ),
        )
        for i, count in enumerate(counts)
    ]


def table(
    name: str = "carts",
    strategy: dict | None = None,
    *,
    grain_types=None,
    version: int = 1,
    uid: str | None = None,
    filters=(),
    table_members=None,
) -> PlacementTableDocument:
    return PlacementTableDocument(
        grain_type=GrainTypeRef(namespace="shop", name=name, uid=uid or f"uid-{name}"),
        grain_types=grain_types if grain_types is not None else [name],
        default=name == "default",
        version=version,
        published_at=datetime(2025, 1, 1, tzinfo=UTC),
        strategy=GrainStrategySpec.model_validate(strategy or {"name": "Random"}),
        filters=[PlacementFilter.model_validate(f) for f in filters],
        load_shedding=LoadShedding(),
        members=table_members if table_members is not None else members(),
    )


def director(*docs, local="w-0") -> PlacementDirector:
    return PlacementDirector.from_documents(docs, local, rng=random.Random(7))


def place_many(d: PlacementDirector, grain_type: str, n: int, **kw) -> Counter[str]:
    return Counter(d.place(grain_type, f"g/{i}", **kw) for i in range(n))


ALL = {f"w-{i}" for i in range(8)}


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ({"name": "Random"}, ALL),
        ({"name": "PreferLocal"}, {"w-3"}),
        ({"name": "HashBased"}, ALL),
        ({"name": "ConsistentHashBased"}, ALL),
        ({"name": "ActivationCountBased"}, ALL),
        # Equal statistics and no optimistic accounting: ties keep the local member (Orleans).
        (
            {
                "name": "ResourceOptimized",
                "resourceOptimized": {
                    "localSiloPreferenceMargin": 0,
                    "optimisticAccounting": False,
                },
            },
            {"w-3"},
        ),
        # With it (the default), the local member's own placements lift it off the tie.
        (
            {"name": "ResourceOptimized", "resourceOptimized": {"localSiloPreferenceMargin": 0}},
            ALL,
        ),
        (
            {"name": "SiloRoleBased", "siloRoleBased": {"role": "batch"}},
            {"w-4", "w-5", "w-6", "w-7"},
        ),
    ],
)
def test_every_strategy_places_through_the_engine(strategy, expected) -> None:
    d = director(table(strategy=strategy), local="w-3")
    placed = place_many(d, "carts", 400)
    assert set(placed) == expected
    assert sum(placed.values()) == 400
    assert d.placements == Counter({("carts", m): n for m, n in placed.items()})


def test_hash_strategies_are_deterministic_across_directors() -> None:
    for name in ("HashBased", "ConsistentHashBased"):
        a = director(table(strategy={"name": name}), local="w-0")
        b = director(table(strategy={"name": name}), local="w-5")
        assert [a.place("carts", f"g/{i}") for i in range(50)] == [
            b.place("carts", f"g/{i}") for i in range(50)
        ]


def test_local_member_is_per_call_or_the_directors() -> None:
    d = director(table(strategy={"name": "PreferLocal"}), local="w-1")
    assert d.place("carts", "g") == "w-1"
    assert d.place("carts", "g", "w-6") == "w-6"


def test_hint_is_honoured_when_eligible() -> None:
    d = director(table(strategy={"name": "HashBased"}, table_members=members(overloaded={"w-2"})))
    assert d.place("carts", "g", hint="w-5") == "w-5"
    load_aware = director(
        table(strategy={"name": "ActivationCountBased"}, table_members=members(overloaded={"w-2"}))
    )
    assert {load_aware.place("carts", f"g/{i}", hint="w-2") for i in range(50)} <= ALL - {"w-2"}


def test_overloaded_members_receive_nothing_new() -> None:
    shed = {"w-2", "w-5"}
    d = director(
        table(strategy={"name": "ActivationCountBased"}, table_members=members(overloaded=shed))
    )
    assert set(place_many(d, "carts", 500)) == ALL - shed
    # ResourceOptimized called from an overloaded member does not keep the grain local.
    d = director(
        table(strategy={"name": "ResourceOptimized"}, table_members=members(overloaded=shed)),
        local="w-2",
    )
    placed = place_many(d, "carts", 500)
    assert placed
    assert not set(placed) & shed


def test_required_match_keeps_the_callers_zone() -> None:
    d = director(table(filters=[{"type": "RequiredMatch", "keys": ["zone"]}]))
    for local in sorted(ALL):
        zone = ZONES[int(local[-1])]
        expected = {f"w-{i}" for i in range(8) if ZONES[i] == zone}
        assert set(place_many(d, "carts", 100, local_member=local)) == expected


def test_stateless_worker_counts_local_activations_it_is_told_about() -> None:
    d = director(table(strategy={"name": "StatelessWorker", "statelessWorker": {"maxLocal": 2}}))
    for _ in range(2):
        assert d.place("carts", "pool") == "w-0"
        d.activated("carts", "pool")
    with pytest.raises(StatelessWorkerAtCapacity):
        d.place("carts", "pool")
    assert d.place("carts", "other") == "w-0", "the limit is per grain"
    d.deactivated("carts", "pool")
    assert d.place("carts", "pool") == "w-0"
    with pytest.raises(StatelessWorkerAtCapacity):
        d.place("carts", "pool", local_activations=2)


def test_default_graintype_places_types_without_their_own() -> None:
    d = director(
        table("carts", {"name": "PreferLocal"}, grain_types=["Shop.Cart"]),
        table("default", {"name": "SiloRoleBased", "siloRoleBased": {"role": "batch"}}),
    )
    assert d.place("Shop.Cart", "c/1") == "w-0"
    assert d.place("Shop.Order", "o/1") in {"w-4", "w-5", "w-6", "w-7"}
    why = d.explain("Shop.Order", "o/1")
    assert why.graintype == "default"
    assert why.via_default
    assert not d.explain("Shop.Cart", "c/1").via_default
    d.remove("default")
    with pytest.raises(NoPlacementTable, match="GrainType named 'default'"):
        d.place("Shop.Order", "o/1")
    assert present(d.explain("Shop.Order", "o/1").error, "error").startswith("no placement table")


def test_conflicting_claims_go_to_the_first_graintype_by_name() -> None:
    d = director(
        table(
            "b-carts",
            {"name": "SiloRoleBased", "siloRoleBased": {"role": "batch"}},
            grain_types=["Cart"],
        ),
        table("a-carts", {"name": "PreferLocal"}, grain_types=["Cart"]),
    )
    assert d.place("Cart", "x") == "w-0"
    assert present(d.table_for("Cart"), "Cart's table").grain_type.name == "a-carts"


def test_optimistic_increments_last_until_a_new_table_version() -> None:
    # Two members: w-1 is behind by 10; each pick adds 2 (members reporting) to the estimate.
    two = members([10, 0])[:2]
    d = director(table(strategy={"name": "ActivationCountBased"}, table_members=two))
    assert [d.place("carts", f"g/{i}") for i in range(5)] == ["w-1"] * 5
    assert not d.apply(table(strategy={"name": "ActivationCountBased"}, table_members=two))
    after_same = [d.place("carts", f"h/{i}") for i in range(6)]
    assert "w-0" in after_same, "same version: the increments are kept, so w-1 is caught up"
    assert d.apply(table(strategy={"name": "ActivationCountBased"}, table_members=two, version=2))
    assert [d.place("carts", f"k/{i}") for i in range(5)] == ["w-1"] * 5, "reset on a new version"


def test_older_versions_are_ignored_a_recreated_graintype_is_not() -> None:
    d = director(table(version=5))
    assert not d.apply(table(version=4, strategy={"name": "PreferLocal"}))
    assert present(d.table_for("carts"), "carts' table").version == 5
    assert d.apply(table(version=1, uid="new-uid", strategy={"name": "PreferLocal"}))
    assert d.place("carts", "g") == "w-0"


def test_a_strategy_change_rebuilds_the_strategy() -> None:
    d = director(table(strategy={"name": "PreferLocal"}))
    assert d.place("carts", "g") == "w-0"
    d.apply(
        table(version=2, strategy={"name": "SiloRoleBased", "siloRoleBased": {"role": "batch"}})
    )
    assert d.place("carts", "g") in {"w-4", "w-5", "w-6", "w-7"}


def test_a_strategy_this_worker_cannot_run_fails_placements_with_the_reason() -> None:
    doc = table(strategy={"name": "Custom", "custom": {"entryPoint": "NotInstalled"}})
    d = director(doc)
    with pytest.raises(PlacementError, match=r"GrainType 'carts'.*NotInstalled"):
        d.place("carts", "g")
    assert "NotInstalled" in present(d.explain("carts", "g").error, "error")


def test_no_member_left_raises_no_compatible_member() -> None:
    d = director(table(table_members=[]))
    with pytest.raises(NoCompatibleMember):
        d.place("carts", "g")


def test_explain_reports_filters_candidates_scores_and_changes_nothing() -> None:
    counts = [5, 50, 7, 9, 11, 13, 15, 17]
    d = director(
        table(
            strategy={"name": "ActivationCountBased", "activationCountBased": {"chooseOutOf": 8}},
            filters=[{"type": "RequiredMatch", "keys": ["apportion.dev/role"]}],
            table_members=members(counts, overloaded={"w-2"}),
            version=9,
        )
    )
    why = d.explain("carts", "g/1")
    assert why.chosen == "w-0"
    assert why.table_version == 9
    assert why.graintype == "carts"
    out = why.to_dict()
    assert out["filters"][0]["removed"] == ["w-4", "w-5", "w-6", "w-7"]
    assert out["excluded"] == {"w-2": "overloaded"}
    assert {c["member"]: c["score"] for c in out["candidates"]} == {
        "w-0": 5.0,
        "w-1": 50.0,
        "w-3": 9.0,
    }
    assert d.explain("carts", "g/1").to_dict() == out, "explain made no optimistic increment"
    assert d.placements == Counter()


def test_counters_follow_activations() -> None:
    d = director(table())
    d.activated("carts", "a")
    d.activated("carts", "b")
    d.deactivated("carts", "a")
    assert d.counts() == {
        "hosted": {"carts": 1},
        "started": {"carts": 2},
        "placements": {},
        "tables": {"carts": 1},
    }
    d.deactivated("carts", "b")
    d.deactivated("carts", "b")
    assert d.hosted["carts"] == 0, "never below zero"


def test_concurrent_placements_and_table_updates() -> None:
    d = director(table(strategy={"name": "ActivationCountBased"}))
    errors: list[BaseException] = []

    def placer(seed: int) -> None:
        try:
            for i in range(3000):
                d.place("carts", f"{seed}/{i}")
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=placer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for version in range(2, 200):
        size = 2 + version % 7
        d.apply(
            table(
                strategy={"name": "ActivationCountBased"},
                version=version,
                table_members=members([version % 5] * size),
            )
        )
    for t in threads:
        t.join()
    assert errors == []
    assert sum(d.placements.values()) == 12000


def test_samples_render_as_the_metrics_contract() -> None:
    from apportion.api.worker_report import WorkerReport, parse, render
    from apportion.grains._director import METRIC_HELP

    d = director(table(strategy={"name": "PreferLocal"}, version=3))
    for i in range(3):
        d.activated("carts", f"g/{i}")
        d.place("carts", f"g/{i}")
    d.deactivated("carts", "g/0")
    text = render(d.samples(), helps=METRIC_HELP)
    assert WorkerReport.parse(text).activations == {"carts": 2}
    by_name = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in parse(text)}
    assert by_name["apportion_grain_placements", (("grain_type", "carts"), ("member", "w-0"))] == 3
    assert by_name["apportion_grain_activations_started", (("grain_type", "carts"),)] == 3
    assert by_name["apportion_grain_placement_table_version", (("graintype", "carts"),)] == 3
