"""`apportion explain grain` output, from offline tables (the live read is covered end to end)."""

from __future__ import annotations

from apportion.cli.explain import format_explanation
from tests.unit.test_director import director, members, table


def test_human_output_names_table_filters_exclusions_and_scores() -> None:
    d = director(
        table(
            strategy={"name": "ActivationCountBased", "activationCountBased": {"chooseOutOf": 8}},
            filters=[{"type": "RequiredMatch", "keys": ["apportion.dev/role"]}],
            table_members=members([5, 50, 7, 9, 11, 13, 15, 17], overloaded={"w-2"}),
            version=4,
        )
    )
    text = format_explanation(d.explain("carts", "g/1").to_dict(), local="w-0", hint=None)
    lines = text.splitlines()
    assert "decided by GrainType carts, table version 4" in lines[1]
    assert lines[3] == "  -> w-0"
    assert "filter RequiredMatch(apportion.dev/role): kept 4, removed w-4, w-5, w-6, w-7" in lines
    assert "excluded w-2: overloaded" in lines
    assert any(line.startswith("w-0") and line.endswith("<- chosen") for line in lines)
    assert any(line.startswith("w-1") and " 50 " in line for line in lines)


def test_hint_and_default_and_missing_table() -> None:
    d = director(table("default", {"name": "HashBased"}))
    out = d.explain("Shop.Order", "o/1", "w-0", "w-6").to_dict()
    assert out["chosen"] == "w-6"
    assert out["viaDefault"]
    text = format_explanation(out, local="w-0", hint="w-6")
    assert "(the namespace default)" in text
    assert "placement hint 'w-6' honoured" in text
    d.remove("default")
    missing = format_explanation(d.explain("Shop.Order", "o/1").to_dict(), local=None, hint=None)
    assert "not placed: no placement table for grain type 'Shop.Order'" in missing
