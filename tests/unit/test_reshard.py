"""Online resharding (apportion.engine.reshard and the pass that drives it): the range
arithmetic against the key scheme itself, and the table sequence of a split and a merge."""

from __future__ import annotations

import itertools
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion.api.assignment import (
    AssignmentFormatError,
    AssignmentTable,
    Incarnation,
    Lineage,
    from_document,
    to_document,
)
from apportion.engine.handoff import Reason, owned_units, plan_worker
from apportion.engine.keys import get_scheme
from apportion.engine.reshard import hash_range, next_count, reshape
from apportion.engine.set_pass import initial_table
from apportion.engine.set_status import StatusInput, unit_set_status
from tests.support.passes import decided, written
from tests.support.present import present
from tests.unit.test_assignment_format import schema
from tests.unit.test_unitset_pass import REF, acked, pset, run, settle, workers

SCHEME = get_scheme("apportion")
KEYS = [f"order-{i}" for i in range(4000)]


def owner_of_keys(table: AssignmentTable) -> dict[str, str | None]:
    """Which pod serves each key under `table` (the worker's rule: the table's own count)."""
    units = SCHEME.units(KEYS, table.count).tolist()
    return {key: table.units[str(u)].owner for key, u in zip(KEYS, units, strict=True)}


@given(st.integers(0, 2**64 - 1), st.integers(1, 100_000))
def test_a_hash_lies_in_the_range_of_the_unit_multiply_shift_gives_it(h: int, count: int) -> None:
    lo, hi = hash_range((h * count) >> 64, count)
    assert lo <= h < hi


@given(st.integers(1, 5000), st.integers(2, 64), st.booleans(), st.data())
def test_children_tile_their_parent(small: int, k: int, split: bool, data: Any) -> None:
    old_count, new_count = (small, small * k) if split else (small * k, small)
    lineage = Lineage(old_count, new_count, 1, (0,) * old_count)
    old = data.draw(st.integers(0, lineage.from_count - 1))
    children = lineage.children(old)
    ranges = [hash_range(c, lineage.to_count) for c in children]
    if split:
        assert ranges[0][0] == hash_range(old, lineage.from_count)[0]
        assert ranges[-1][1] == hash_range(old, lineage.from_count)[1]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(lineage.parents(c) == range(old, old + 1) for c in children)
    else:
        (parent,) = children
        assert old in lineage.parents(parent)
        lo, hi = hash_range(parent, lineage.to_count)
        olo, ohi = hash_range(old, lineage.from_count)
        assert lo <= olo < ohi <= hi


@pytest.mark.parametrize(
    ("published", "wanted", "expected"),
    [(32, 128, 128), (128, 64, 64), (32, 48, 16), (16, 48, 48), (48, 32, 16)],
)
def test_next_count_goes_through_the_gcd_when_counts_are_not_multiples(
    published: int, wanted: int, expected: int
) -> None:
    assert next_count(published, wanted) == expected


def test_a_lineage_must_be_an_integer_factor() -> None:
    with pytest.raises(AssignmentFormatError):
        Lineage(32, 48, 1, (0,) * 32)


@pytest.fixture
def spec32() -> Any:
    return pset(keyScheme="apportion", rebalance={"interval": "1s", "handoffTimeout": "5s"})


def reshaped(spec: Any, count: int) -> Any:
    return spec.model_copy(update={"partitions": count})


def test_a_split_by_four_moves_no_key(spec32: Any) -> None:
    members = workers(4)
    table, _ = settle(spec32, initial_table(REF, spec32, 1), members, 1000.0)
    before = owner_of_keys(table)
    result = run(reshaped(spec32, 128), table, acked(table, members))
    split = written(result)
    assert split is not None
    assert split.count == 128
    assert split.epoch == table.epoch + 1
    tokens = tuple(table.units[str(u)].epoch for u in range(32))
    assert split.lineage == Lineage(32, 128, split.epoch, tokens)
    assert [e.reason for e in decided(result).events] == [Reason.RESHARDED]
    assert not split.releasing()
    assert all(state.epoch == split.epoch for state in split.units.values())
    for unit in range(128):
        assert split.units[str(unit)].owner == table.units[str(unit // 4)].owner
    assert owner_of_keys(split) == before  # the split alone moves nothing
    again = run(reshaped(spec32, 128), split, acked(split, members))
    assert again.resharding is None


def test_a_split_waits_for_hand_offs_under_way(spec32: Any) -> None:
    members = workers(4)
    table, _ = settle(spec32, initial_table(REF, spec32, 1), workers(3), 1000.0)
    moving = written(run(spec32, table, members, now=2000.0))  # w-3 joins: releases begin
    assert moving is not None
    assert moving.releasing()
    bigger = reshaped(spec32, 64)
    held = run(bigger, moving, members, now=2000.5)  # no acks yet
    assert held.new_table is None
    assert held.resharding is not None
    assert held.resharding.ready == 64 - 2 * len(moving.releasing())
    status = unit_set_status(StatusInput(moving, held, members, 2, "cm", 2000.5))
    assert status["resharding"] == {
        "fromCount": 32,
        "toCount": 64,
        "phase": "Settling",
        "readyUnits": held.resharding.ready,
        "totalUnits": 64,
    }
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Resharding"]["status"] == "True"
    done = written(run(bigger, moving, acked(moving, members), now=2001.0))
    assert done is not None
    assert done.count == 32
    assert not done.releasing()
    writing = run(bigger, done, acked(done, members), now=2001.5)
    split = written(writing)
    assert split is not None
    assert split.count == 64
    assert owner_of_keys(split) == owner_of_keys(done)
    # That pass planned 32 units: it says nothing of the 64 yet, so not Balanced.
    status = unit_set_status(StatusInput(split, writing, members, 2, "cm", 2001.5))
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Resharding"]["status"] == "False"
    assert (conditions["Balanced"]["status"], conditions["Balanced"]["reason"]) == (
        "False",
        "Rebalancing",
    )


def test_split_then_rebalance_then_merge_loses_no_unit(spec32: Any) -> None:
    four, six = workers(4), workers(6)
    table, _ = settle(spec32, initial_table(REF, spec32, 1), four, 1000.0)
    spec128 = reshaped(spec32, 128)
    table, results = settle(spec128, table, six, 2000.0)
    assert table.count == 128
    assert table.lineage is not None
    assert sorted(len(u) for u in table.by_member().values()) == [21, 21, 21, 21, 22, 22]
    # Every move after the split was one the rebalance asked for: to the two new pods only.
    moves = [e for r in results for e in decided(r).events if e.reason is Reason.HANDOFF_STARTED]
    assert {e.target for e in moves} <= {"w-4", "w-5"}
    # the fewest a balanced end state allows: each new pod needs at least ⌊128/6⌋ units
    assert sum(len(e.units) for e in moves) == 2 * (128 // 6)

    # Merge by two: only the siblings that sit apart move (one of each such pair), then the
    # merged table moves no key; afterwards the rebalance evens the 64 units out.
    spec64 = reshaped(spec32, 64)
    apart = sum(
        table.units[str(2 * p)].owner != table.units[str(2 * p + 1)].owner for p in range(64)
    )
    gathered, now = 0, 3000.0
    while table.count == 128:
        result = run(spec64, table, acked(table, six), now)
        assert result.new_table is not None
        events = decided(result).events
        gathered += sum(len(e.units) for e in events if e.reason is Reason.HANDOFF_STARTED)
        if written(result).count == 64:
            assert owner_of_keys(written(result)) == owner_of_keys(table)
        table, now = written(result), now + 1.0
    assert gathered == apart
    merged, _ = settle(spec64, table, six, now)
    assert merged.count == 64
    assert merged.lineage is not None
    assert (merged.lineage.from_count, merged.lineage.epoch) == (128, table.epoch)
    assert all(state.owner is not None for state in merged.units.values())
    assert sorted(len(u) for u in merged.by_member().values()) == [10, 10, 11, 11, 11, 11]


def test_other_key_schemes_never_reshard() -> None:
    spec = pset(keyScheme="netherite")
    table, _ = settle(spec, initial_table(REF, spec, 1), workers(2), 1000.0)
    result = run(reshaped(spec, 64), table, workers(2))
    assert result.resharding is None
    assert result.new_table is None or written(result).count == 32


@pytest.mark.parametrize("layout", ["map", "indexed"])
def test_lineage_round_trips_and_an_old_reader_still_parses(spec32: Any, layout: Any) -> None:
    members = workers(3)
    table, _ = settle(spec32, initial_table(REF, spec32, 1), members, 1000.0)
    split = written(run(reshaped(spec32, 96), table, acked(table, members)))
    doc = to_document(split, layout)
    assert doc["formatVersion"] == 2
    assert doc["lineage"] == {
        "fromCount": 32,
        "epoch": split.epoch,
        "parentEpochs": [table.units[str(u)].epoch for u in range(32)],
    }
    assert from_document(doc) == split
    jsonschema.validate(doc, schema("assignment"))
    old = {k: v for k, v in doc.items() if k not in ("formatVersion", "lineage")}
    assert from_document(old).units == split.units


def test_a_merge_gathers_where_most_siblings_are() -> None:
    spec = pset(keyScheme="apportion", partitions=64)
    members = workers(5)
    table, _ = settle(spec, initial_table(REF, spec, 1), members, 1000.0)
    owners = {u: table.units[str(u)].owner for u in range(64)}
    merged, _ = settle(reshaped(spec, 16), table, members, 2000.0)
    for parent in range(16):
        siblings = [owners[u] for u in range(4 * parent, 4 * parent + 4)]
        assert siblings.count(merged.units[str(parent)].owner) == max(
            siblings.count(o) for o in siblings
        )


def serving_of(table: AssignmentTable, name: str) -> dict[str, int]:
    """What a process that handled `table` serves: its units under their tokens."""
    return {u: s.epoch for u, s in table.units.items() if s.owner == name}


def test_a_worker_carries_its_parents_state_into_its_children(spec32: Any) -> None:
    members = workers(2)
    table, _ = settle(spec32, initial_table(REF, spec32, 1), members, 1000.0)
    split = written(run(reshaped(spec32, 64), table, acked(table, members)))
    me = Incarnation("w-0", "uid-w-0")
    plan = reshape(split, me, 32, serving_of(table, "w-0"))
    assert plan is not None
    assert not plan.dropped
    assert not plan.load
    assert plan.carried == {
        str(c): (str(c // 2),) for c in range(64) if split.units[str(c)].owner == "w-0"
    }
    after = plan_worker(split, me, plan.serving)
    assert not after.acquire
    assert not after.stop
    assert reshape(split, me, 64, plan.serving) is None


def test_a_worker_with_a_stale_token_or_a_missed_resharding_reloads(spec32: Any) -> None:
    members = workers(2)
    table, _ = settle(spec32, initial_table(REF, spec32, 1), members, 1000.0)
    split = written(run(reshaped(spec32, 64), table, acked(table, members)))
    me = Incarnation("w-0", "uid-w-0")
    stale = {u: token - 1 for u, token in serving_of(table, "w-0").items()}
    plan = present(reshape(split, me, 32, stale), "the reshape of a stale token")
    assert plan.carried == {}
    assert plan.dropped == set(stale)
    assert plan_worker(split, me, plan.serving).acquire == owned_units(split, me)
    missed = present(reshape(split, me, 16, {"3": 1}), "the reshape of a missed resharding")
    assert missed.carried == {}
    assert missed.dropped == {"3"}


def test_a_merge_loads_the_siblings_this_process_does_not_hold() -> None:
    spec = pset(keyScheme="apportion", partitions=4)
    members = workers(1)
    table, _ = settle(spec, initial_table(REF, spec, 1), members, 1000.0)
    merged = written(run(reshaped(spec, 2), table, acked(table, members)))
    me = Incarnation("w-0", "uid-w-0")
    held = {u: t for u, t in serving_of(table, "w-0").items() if u != "3"}
    plan = present(reshape(merged, me, 4, held), "the reshape of the merge")
    assert plan.carried == {"0": ("0", "1"), "1": ("2",)}
    assert plan.load == {"1": ("3",)}


def test_locate_answers_from_a_table_mid_resharding(spec32: Any, tmp_path: Any) -> None:
    from apportion.api.assignment import encode_assignment
    from tests.unit.test_cli_locate_plan import apportion

    members = workers(3)
    table, _ = settle(spec32, initial_table(REF, spec32, 1), members, 1000.0)
    split = written(run(reshaped(spec32, 128), table, acked(table, members)))
    (root,) = encode_assignment(split)
    configmap = {"kind": "ConfigMap", "metadata": {"name": "demo-cm"}, **root.body()}
    path = tmp_path / "cm.json"
    path.write_text(json.dumps(configmap))
    ids = KEYS[:50]
    result = apportion("locate", "--table", str(path), "--json", *ids)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    owners = owner_of_keys(split)
    for entry in found:
        assert entry["unit"] == SCHEME.unit(entry["id"], 128)
        assert entry["previousUnit"] == SCHEME.unit(entry["id"], 32) == entry["unit"] // 4
        assert entry["pod"] == owners[entry["id"]] == owner_of_keys(table)[entry["id"]]
    plain = apportion("locate", "--table", str(path), ids[0]).stdout.split("\t")
    assert plain[:3] == [ids[0], str(found[0]["unit"]), found[0]["pod"]]


def test_the_split_merge_scenario_moves_nothing_at_the_split() -> None:
    from apportion.engine.scenarios import make_scenario, run_steps

    scenario = make_scenario("split-merge", units=32, members=4)
    rows = list(run_steps(scenario, {"name": "Balanced"}))
    (_, before, _), (split, after_split, _), (_, grown, _), (merge, _, _) = rows
    assert split.units == 128
    assert split.moves == 0
    where = {u: m for m, us in before.items() for u in us}
    parents = present(scenario.steps[0].parents, "the split's parents")
    assert all(where[parents[u][0]] == m for m, us in after_split.items() for u in us)
    owner = {u: m for m, us in grown.items() for u in us}
    siblings = present(scenario.steps[2].parents, "the merge's parents").values()
    apart = sum(owner[a] != owner[b] for a, b in siblings)
    assert merge.units == 64
    assert merge.moves >= apart > 0
