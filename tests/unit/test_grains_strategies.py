"""Every built-in grain strategy: where it may place (properties over random tables) and the
Orleans behaviours each one promises."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.api.placement_table import TableMember, TableStats
from apportion.engine.grains import (
    BUILTIN_STRATEGIES,
    ActivationCountBasedPlacement,
    NoCompatibleMember,
    PlacementContext,
    PlacementError,
    PlacementTable,
    ResourceOptimizedPlacement,
    ResourceWeights,
    StatelessWorkerAtCapacity,
    hashing,
    make_grain_strategy,
    resource_terms,
)

GIB = 1 << 30
ROLE = "apportion.dev/role"
LOAD_AWARE = {"ActivationCountBased", "ResourceOptimized"}


def spec_for(name: str) -> dict[str, object]:
    return {"name": name, "role": "web"} if name == "SiloRoleBased" else {"name": name}


stats_strategy = st.builds(
    TableStats,
    cpu_usage=st.floats(0, 100),
    memory_usage=st.floats(0, 100),
    available_memory=st.integers(0, 4 * GIB),
    max_available_memory=st.sampled_from([0, 2 * GIB, 4 * GIB]),
    activation_count=st.integers(0, 1000),
    cpu_count=st.integers(1, 8),
    overloaded=st.booleans(),
)


@st.composite
def tables(draw: st.DrawFn) -> PlacementTable:
    count = draw(st.integers(1, 12))
    members = [
        TableMember(
            name=f"w{i:02d}",
            labels={
                "zone": draw(st.sampled_from("abc")),
                ROLE: draw(st.sampled_from(["web", "db"])),
            },
            stats=draw(st.none() | stats_strategy),
        )
        for i in range(count)
    ]
    return PlacementTable(draw(st.permutations(members)), version=draw(st.integers(0, 9)))


@st.composite
def contexts(draw: st.DrawFn, table: PlacementTable) -> PlacementContext:
    local = draw(st.sampled_from([*table.names, "outsider"]))
    hint = draw(st.none() | st.sampled_from([*table.names, "gone"]))
    return PlacementContext(local_member=local, hint=hint)


def eligible(table: PlacementTable, name: str, strategy_name: str) -> bool:
    if strategy_name not in LOAD_AWARE:
        return True
    return not table.overloaded[table.index[name]]


@settings(derandomize=True, deadline=None, max_examples=300)
@given(st.data(), st.sampled_from(sorted(BUILTIN_STRATEGIES)), st.booleans())
def test_placements_stay_inside_the_filters_and_off_overloaded_members(
    data: st.DataObject, name: str, required_zone: bool
) -> None:
    table = data.draw(tables())
    ctx = data.draw(contexts(table))
    filters = [{"type": "RequiredMatch", "keys": ["zone"]}] if required_zone else []
    strategy = make_grain_strategy(spec_for(name), filters, rng=random.Random(0))
    strategy.update(table)
    caller_zone = (
        table.member(ctx.local_member).labels["zone"]
        if ctx.local_member is not None and ctx.local_member in table.index
        else None
    )
    for i in range(20):
        try:
            chosen = strategy.place(f"grain-{i}", ctx)
        except PlacementError:
            continue
        assert chosen in table.index
        if required_zone:
            assert table.member(chosen).labels.get("zone") == caller_zone
        if name == "SiloRoleBased":
            assert table.member(chosen).labels[ROLE] == "web"
        # Load-aware strategies may fall back to members that have not reported statistics,
        # never to overloaded ones.
        assert eligible(table, chosen, name)


@settings(derandomize=True, deadline=None, max_examples=200)
@given(st.data(), st.sampled_from(sorted(BUILTIN_STRATEGIES)))
def test_an_eligible_hint_is_honoured(data: st.DataObject, name: str) -> None:
    table = data.draw(tables())
    hint = data.draw(st.sampled_from(table.names))
    strategy = make_grain_strategy(spec_for(name), rng=random.Random(0))
    strategy.update(table)
    ctx = PlacementContext(local_member=table.names[0], hint=hint)
    wrong_role = name == "SiloRoleBased" and table.member(hint).labels[ROLE] != "web"
    if not eligible(table, hint, name) or wrong_role:
        try:
            chosen = strategy.place("g", ctx)
        except PlacementError:
            return
        assert chosen != hint
        assert "ignored" in strategy.explain("g", ctx).notes[0]
        return
    assert strategy.place("g", ctx) == hint
    assert "honoured" in strategy.explain("g", ctx).notes[0]


@settings(derandomize=True, deadline=None, max_examples=200)
@given(st.data(), st.sampled_from(["PreferLocal", "StatelessWorker"]))
def test_local_strategies_stay_local(data: st.DataObject, name: str) -> None:
    table = data.draw(tables())
    local = data.draw(st.sampled_from(table.names))
    strategy = make_grain_strategy({"name": name, "maxLocal": 1_000_000}, rng=random.Random(0))
    strategy.update(table)
    ctx = PlacementContext(local_member=local)
    assert {strategy.place(f"g{i}", ctx) for i in range(50)} == {local}


def test_prefer_local_falls_back_to_random_when_local_is_not_compatible() -> None:
    table = PlacementTable(TableMember(name=f"w{i}") for i in range(4))
    strategy = make_grain_strategy({"name": "PreferLocal"}, rng=random.Random(1))
    strategy.update(table)
    placed = Counter(strategy.place(f"g{i}", PlacementContext("elsewhere")) for i in range(400))
    assert set(placed) == set(table.names)


def test_random_is_uniform_enough() -> None:
    table = PlacementTable(TableMember(name=f"w{i}") for i in range(10))
    strategy = make_grain_strategy({"name": "Random"}, rng=random.Random(5))
    strategy.update(table)
    placed = Counter(strategy.place(f"g{i}", PlacementContext()) for i in range(10_000))
    assert set(placed) == set(table.names)
    assert max(placed.values()) < 1.15 * 1000
    assert min(placed.values()) > 0.85 * 1000


# --- StatelessWorker -----------------------------------------------------------------------


def test_stateless_worker_is_local_until_max_local() -> None:
    table = PlacementTable(
        [TableMember(name="w0", stats=TableStats(cpu_count=3)), TableMember(name="w1")]
    )
    default = make_grain_strategy({"name": "StatelessWorker"})
    default.update(table)
    ctx = PlacementContext("w0")
    assert [default.place("s", ctx.with_call(local_activations=n)) for n in range(3)] == ["w0"] * 3
    with pytest.raises(StatelessWorkerAtCapacity, match="3 local activations, maxLocal 3") as info:
        default.place("s", ctx.with_call(local_activations=3))
    assert (info.value.member, info.value.max_local) == ("w0", 3)

    explicit = make_grain_strategy({"name": "StatelessWorker", "maxLocal": 1})
    explicit.update(table)
    assert explicit.place("s", ctx) == "w0"
    with pytest.raises(StatelessWorkerAtCapacity):
        explicit.place("s", ctx.with_call(local_activations=1))
    # No statistics for w1: its processor count is unknown, so one activation.
    with pytest.raises(StatelessWorkerAtCapacity):
        default.place("s", PlacementContext("w1", local_activations=1))
    # A hint naming the full local member does not get around the limit; another member's does.
    with pytest.raises(StatelessWorkerAtCapacity):
        explicit.place("s", ctx.with_call(hint="w0", local_activations=1))
    assert explicit.place("s", ctx.with_call(hint="w1", local_activations=1)) == "w1"


# --- SiloRoleBased ---------------------------------------------------------------------------


def role_table() -> PlacementTable:
    return PlacementTable(
        [
            TableMember(name="w0", labels={ROLE: "web"}),
            TableMember(name="w1", labels={ROLE: "web"}),
            TableMember(name="w2", labels={ROLE: "db"}),
            TableMember(name="w3", labels={"tier": "gpu"}),
        ]
    )


def test_silo_role_uses_the_spec_role_or_the_grain_id() -> None:
    fixed = make_grain_strategy({"name": "SiloRoleBased", "role": "web"}, rng=random.Random(2))
    fixed.update(role_table())
    assert {fixed.place(f"g{i}", PlacementContext()) for i in range(100)} == {"w0", "w1"}

    by_key = make_grain_strategy({"name": "SiloRoleBased"})
    by_key.update(role_table())
    assert by_key.place("db", PlacementContext()) == "w2"

    custom_label = make_grain_strategy({"name": "SiloRoleBased", "roleLabel": "tier"})
    custom_label.update(role_table())
    assert custom_label.place("gpu", PlacementContext()) == "w3"


def test_silo_role_without_members_of_the_role_fails_clearly() -> None:
    strategy = make_grain_strategy({"name": "SiloRoleBased", "role": "cache"})
    strategy.update(role_table())
    with pytest.raises(NoCompatibleMember, match=r"no member labelled apportion.dev/role=cache"):
        strategy.place("g", PlacementContext())
    explanation = strategy.explain("g", PlacementContext())
    assert explanation.excluded["w2"] == "apportion.dev/role is not 'cache'"


# --- HashBased -------------------------------------------------------------------------------


@settings(derandomize=True, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=20, unique=True))
def test_hash_based_is_the_sorted_mod_n_of_orleans(names: list[str]) -> None:
    import xxhash

    strategy = make_grain_strategy({"name": "HashBased"})
    strategy.update(PlacementTable(TableMember(name=n) for n in names))
    ordered = sorted(names)
    for grain in ("a", "cart/42", "ü-ñ"):
        expected = (xxhash.xxh3_64_intdigest(grain.encode()) & 0x7FFFFFFF) % len(ordered)
        assert strategy.place(grain, PlacementContext()) == ordered[expected]


# --- ActivationCountBased ------------------------------------------------------------------


def counted(counts: list[int], overloaded: frozenset[int] = frozenset()) -> PlacementTable:
    return PlacementTable(
        TableMember(
            name=f"w{i}",
            stats=TableStats(activation_count=c, cpu_usage=99.0 if i in overloaded else 1),
        )
        for i, c in enumerate(counts)
    )


def test_power_of_two_takes_the_lower_estimate_and_increments_it() -> None:
    strategy = ActivationCountBasedPlacement(rng=random.Random(0))
    strategy.update(counted([0, 1000]))
    first = strategy.place("g", PlacementContext())
    assert first == "w0"
    # One pick stands for one per member reporting statistics: +2 here.
    assert strategy.estimated_count(0) == 2
    strategy.update(counted([0, 1000]))  # a fresh table resets the optimistic increments
    assert strategy.estimated_count(0) == 0


def test_optimistic_increments_spread_placements_between_publishes() -> None:
    strategy = ActivationCountBasedPlacement(choose_out_of=4, rng=random.Random(0))
    strategy.update(counted([0, 0, 0, 0]))
    placed = Counter(strategy.place(f"g{i}", PlacementContext()) for i in range(400))
    assert set(placed.values()) == {100}  # k = n with increments: perfectly even


def test_overloaded_members_get_nothing_and_all_overloaded_fails() -> None:
    strategy = ActivationCountBasedPlacement(rng=random.Random(0))
    strategy.update(counted([0, 50, 60], overloaded=frozenset({0})))
    assert "w0" not in {strategy.place(f"g{i}", PlacementContext()) for i in range(200)}
    strategy.update(counted([0, 0], overloaded=frozenset({0, 1})))
    with pytest.raises(NoCompatibleMember, match="all 2 candidates are overloaded"):
        strategy.place("g", PlacementContext())


def test_without_any_statistics_activation_count_places_locally() -> None:
    strategy = ActivationCountBasedPlacement(rng=random.Random(0))
    strategy.update(
        PlacementTable([TableMember(name="w0"), TableMember(name="w1"), TableMember(name="w2")])
    )
    assert {strategy.place(f"g{i}", PlacementContext("w1")) for i in range(50)} == {"w1"}
    spread = {strategy.place(f"g{i}", PlacementContext("outsider")) for i in range(200)}
    assert spread == {"w0", "w1", "w2"}


def test_members_without_statistics_are_the_fallback_only() -> None:
    strategy = ActivationCountBasedPlacement(rng=random.Random(0))
    table = PlacementTable(
        [
            TableMember(name="w0", stats=TableStats(activation_count=500)),
            TableMember(name="w1"),
            TableMember(name="w2"),
        ]
    )
    strategy.update(table)
    assert {strategy.place(f"g{i}", PlacementContext()) for i in range(50)} == {"w0"}


def test_explain_changes_no_state_and_shows_every_eligible_member() -> None:
    strategy = ActivationCountBasedPlacement(rng=random.Random(0))
    strategy.update(counted([5, 7, 9], overloaded=frozenset({2})))
    explanation = strategy.explain("g", PlacementContext())
    assert [strategy.estimated_count(i) for i in range(3)] == [5, 7, 9]
    assert explanation.excluded == {"w2": "overloaded"}
    scores = {c.member: c for c in explanation.candidates}
    assert set(scores) == {"w0", "w1"}
    sampled = [c for c in explanation.candidates if c.detail["sampled"]]
    assert len(sampled) == 2
    assert explanation.chosen == min(sampled, key=lambda c: c.score or 0).member
    json.dumps(explanation.to_dict())


# --- ResourceOptimized -------------------------------------------------------------------


def test_resource_score_matches_orleans_formula() -> None:
    stats = TableStats(
        cpu_usage=50.0,
        memory_usage=40.0,
        available_memory=1 * GIB,
        max_available_memory=4 * GIB,
        activation_count=10,
    )
    terms = resource_terms(stats, max_max_available_memory=8 * GIB, max_activation_count=20)
    assert terms == pytest.approx((0.5, 0.4, 0.75, 0.5, 0.5))
    weights = ResourceWeights().normalized()
    assert sum(w * t for w, t in zip(weights, terms, strict=True)) == pytest.approx(0.53)


def resource_table(cpus: list[float], overloaded: frozenset[int] = frozenset()) -> PlacementTable:
    return PlacementTable(
        TableMember(
            name=f"w{i}",
            stats=TableStats(
                cpu_usage=cpu,
                memory_usage=cpu,
                available_memory=int(4 * GIB * (1 - cpu / 100)),
                max_available_memory=4 * GIB,
                activation_count=int(cpu),
                overloaded=i in overloaded,
            ),
        )
        for i, cpu in enumerate(cpus)
    )


def test_resource_optimized_picks_the_lowest_sampled_score() -> None:
    strategy = ResourceOptimizedPlacement(local_preference_margin=0, rng=random.Random(4))
    strategy.update(resource_table([10.0 * i for i in range(1, 10)], overloaded=frozenset({0})))
    for i in range(50):
        explanation = strategy.explain(f"g{i}", PlacementContext())
        sampled = [c for c in explanation.candidates if c.detail["sampled"]]
        assert len(sampled) == math.ceil(math.sqrt(8))  # w0 is overloaded: 8 eligible
        assert explanation.chosen == min(sampled, key=lambda c: c.score or 0).member
        assert explanation.excluded == {"w0": "overloaded"}


def test_local_preference_margin_maps_0_to_100_onto_scores() -> None:
    table = resource_table([80.0, 10.0, 20.0, 30.0])
    ctx = PlacementContext("w0")
    always_local = ResourceOptimizedPlacement(local_preference_margin=100, rng=random.Random(1))
    always_local.update(table)
    assert {always_local.place(f"g{i}", ctx) for i in range(100)} == {"w0"}
    # Without accounting, as in Orleans, the others stay the best until the next table.
    never_local = ResourceOptimizedPlacement(
        local_preference_margin=0, optimistic_accounting=False, rng=random.Random(1)
    )
    never_local.update(table)
    assert "w0" not in {never_local.place(f"g{i}", ctx) for i in range(100)}
    # Margin 5 (0.05 on the 0..1 score): a local member a little busier than the best stays —
    # for good in Orleans, which scores the published statistics until the next table ...
    near = resource_table([22.0, 20.0, 20.0, 20.0])
    orleans = ResourceOptimizedPlacement(optimistic_accounting=False, rng=random.Random(1))
    orleans.update(near)
    assert {orleans.place(f"g{i}", ctx) for i in range(100)} == {"w0"}
    # ... and with optimistic accounting only until its own placements lift it past the margin.
    default = ResourceOptimizedPlacement(rng=random.Random(1))
    default.update(near)
    placed = [default.place(f"g{i}", ctx) for i in range(100)]
    assert placed[0] == "w0"
    assert placed.count("w0") < 40
    assert {"w1", "w2", "w3"} <= set(placed)


def test_optimistic_accounting_lifts_the_chosen_member_until_the_next_table() -> None:
    table = resource_table([10.0, 20.0, 30.0, 40.0])
    ctx = PlacementContext("w0")
    strategy = ResourceOptimizedPlacement(local_preference_margin=100, rng=random.Random(2))
    strategy.update(table)

    def local_detail() -> dict[str, float]:
        explanation = strategy.explain("g", ctx)
        return next(c for c in explanation.candidates if c.member == "w0").detail

    before = local_detail()
    assert before["optimistic"] == 0.0
    for i in range(3):
        assert strategy.place(f"g{i}", ctx) == "w0"
    after = local_detail()
    # Three picks, each standing for one activation per member reporting statistics (4); the
    # table's CPU per activation is 1 % (100 % over 100 activations), on 1 core.
    assert after["optimistic"] == 12.0
    assert after["cpuUsage"] == pytest.approx(before["cpuUsage"] + 0.12)
    assert after["memoryUsage"] > before["memoryUsage"]
    assert after["availableMemory"] > before["availableMemory"]
    assert local_detail() == after, "explain accounts nothing"
    strategy.update(table)
    assert local_detail() == before, "a fresh table resets the accounting"


def test_without_accounting_placements_leave_the_estimates_alone() -> None:
    strategy = ResourceOptimizedPlacement(
        local_preference_margin=0, optimistic_accounting=False, rng=random.Random(2)
    )
    strategy.update(resource_table([10.0, 20.0, 30.0, 40.0]))
    placed = {strategy.place(f"g{i}", PlacementContext()) for i in range(50)}
    # Two of four sampled, the lower wins: the busiest member never, however often w0 was picked.
    assert "w0" in placed
    assert "w3" not in placed
    candidates = strategy.explain("g", PlacementContext()).candidates
    assert all(c.detail["optimistic"] == 0.0 for c in candidates)


def test_accounted_scores_are_what_the_choice_compares() -> None:
    strategy = ResourceOptimizedPlacement(local_preference_margin=0, rng=random.Random(5))
    strategy.update(resource_table([10.0 * i for i in range(1, 10)]))
    for i in range(40):
        strategy.place(f"g{i}", PlacementContext())
    for i in range(50):
        explanation = strategy.explain(f"h{i}", PlacementContext())
        sampled = [c for c in explanation.candidates if c.detail["sampled"]]
        assert explanation.chosen == min(sampled, key=lambda c: c.score or 0).member
    assert any(c.detail["optimistic"] > 0 for c in explanation.candidates)


def test_resource_optimized_without_statistics_is_random() -> None:
    strategy = ResourceOptimizedPlacement(rng=random.Random(1))
    strategy.update(PlacementTable(TableMember(name=f"w{i}") for i in range(5)))
    assert len({strategy.place(f"g{i}", PlacementContext("w0")) for i in range(200)}) == 5


def test_resource_optimized_never_places_on_an_overloaded_single_member() -> None:
    strategy = ResourceOptimizedPlacement()
    strategy.update(resource_table([99.0]))
    with pytest.raises(NoCompatibleMember, match="overloaded"):
        strategy.place("g", PlacementContext())


def test_zero_weights_still_place() -> None:
    weights = ResourceWeights(0, 0, 0, 0, 0)
    strategy = ResourceOptimizedPlacement(weights, 0, rng=random.Random(1))
    strategy.update(resource_table([10.0, 20.0, 30.0, 40.0]))
    assert {strategy.place(f"g{i}", PlacementContext()) for i in range(200)} == {
        "w0",
        "w1",
        "w2",
        "w3",
    }


# --- Common -------------------------------------------------------------------------------


def test_placing_before_any_table_fails_clearly() -> None:
    strategy = make_grain_strategy({"name": "Random"})
    with pytest.raises(NoCompatibleMember, match="has no members"):
        strategy.place("g", PlacementContext())


def test_load_only_updates_reuse_the_consistent_hash_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[tuple[str, ...]] = []
    original = hashing.HashRing

    def counting_ring(names: tuple[str, ...], virtual_nodes: int) -> hashing.HashRing:
        built.append(tuple(names))
        return original(names, virtual_nodes)

    monkeypatch.setattr(hashing, "HashRing", counting_ring)
    strategy = make_grain_strategy({"name": "ConsistentHashBased"})
    strategy.update(counted([1, 2, 3]))
    first = strategy.place("g", PlacementContext())
    strategy.update(counted([9, 9, 9]))
    assert strategy.place("g", PlacementContext()) == first
    assert built == [("w0", "w1", "w2")]
    strategy.update(counted([9, 9, 9, 9]))
    strategy.place("g", PlacementContext())
    assert built == [("w0", "w1", "w2"), ("w0", "w1", "w2", "w3")]
