"""PlacementTable, TableStats and load shedding."""

from __future__ import annotations

import pytest

from apportion.api.placement_table import TableMember, TableStats
from apportion.engine.grains import (
    LoadSheddingThresholds,
    PlacementTable,
)


def test_members_are_sorted_by_name_and_indexed() -> None:
    table = PlacementTable(
        [TableMember(name="b"), TableMember(name="c"), TableMember(name="a")], version=4
    )
    assert table.names == ("a", "b", "c")
    assert table.index["c"] == 2
    assert table.member("b").name == "b"
    assert table.version == "4"
    assert len(table) == 3


def test_duplicate_names_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"duplicate member names.*'a'"):
        PlacementTable([TableMember(name="a"), TableMember(name="b"), TableMember(name="a")])


@pytest.mark.parametrize(
    ("cpu", "memory", "flag", "overloaded"),
    [
        (95.0, 90.0, False, False),  # at the thresholds: not over them
        (95.1, 0.0, False, True),
        (0.0, 90.5, False, True),
        (10.0, 10.0, True, True),  # the member says so itself
    ],
)
def test_load_shedding_thresholds_are_strict(
    cpu: float, memory: float, flag: bool, overloaded: bool
) -> None:
    stats = TableStats(cpu_usage=cpu, memory_usage=memory, overloaded=flag)
    table = PlacementTable([TableMember(name="a", stats=stats), TableMember(name="b")])
    assert table.overloaded == (overloaded, False)
    assert table.has_stats == (True, False)


def test_disabled_load_shedding_keeps_only_the_members_own_flag() -> None:
    shedding = LoadSheddingThresholds.from_dict({"enabled": False})
    busy = TableStats(cpu_usage=100.0, memory_usage=100.0)
    flagged = TableStats(overloaded=True)
    table = PlacementTable(
        [TableMember(name="a", stats=busy), TableMember(name="b", stats=flagged)],
        load_shedding=shedding,
    )
    assert table.overloaded == (False, True)


def test_custom_thresholds() -> None:
    shedding = LoadSheddingThresholds.from_dict({"cpuThreshold": 50, "memoryThreshold": 60})
    assert shedding.is_overloaded(TableStats(cpu_usage=51.0))
    assert not shedding.is_overloaded(TableStats(cpu_usage=49.0, memory_usage=59.0))
    assert not shedding.is_overloaded(None)
    with pytest.raises(ValueError, match=r"0\.\.100"):
        LoadSheddingThresholds(cpu_threshold=120.0)


def test_from_dict_reads_the_camel_case_table() -> None:
    table = PlacementTable.from_dict(
        {
            "version": "17",
            "loadShedding": {"cpuThreshold": 80},
            "members": [
                {
                    "name": "w-1",
                    "labels": {"zone": "a"},
                    "stats": {
                        "cpuUsage": 85.0,
                        "memoryUsage": 10.0,
                        "availableMemory": 100,
                        "maxAvailableMemory": 200,
                        "activationCount": 7,
                        "cpuCount": 8,
                    },
                },
                {"name": "w-0"},
            ],
        }
    )
    assert table.names == ("w-0", "w-1")
    assert table.version == "17"
    assert table.activation_counts == (0, 7)
    assert table.overloaded == (False, True)
    stats = table.member("w-1").stats
    assert stats is not None
    assert stats.cpu_count == 8
    assert stats.max_available_memory == 200
    assert table.member("w-1").labels == {"zone": "a"}


@pytest.mark.parametrize(
    "kwargs",
    [{"cpu_usage": -1.0}, {"activation_count": -1}, {"available_memory": -5}, {"cpu_count": 0}],
)
def test_impossible_statistics_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"validation error for TableStats"):
        TableStats(**kwargs)
