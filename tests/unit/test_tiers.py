"""The test tiers (tests/support/tiers.py): a laptop leaves out what needs Linux or root, and says
why."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from tests.support import tiers

TESTS = tiers.TESTS


def item(path: str, *fixtures: str, marks: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(
        path=TESTS / path,
        fixturenames=list(fixtures),
        get_closest_marker=lambda name: name if name in marks else None,
    )


def test_each_test_is_in_the_tier_its_place_and_fixtures_say() -> None:
    assert tiers.tier(item("unit/test_worker_lease.py")) == "unit"  # type: ignore[arg-type]
    assert tiers.tier(item("e2e/test_cut_off.py", "dev_cluster")) == "e2e"  # type: ignore[arg-type]
    on_node = item("e2e/test_helm_chart.py", "installed_operator")
    assert tiers.tier(on_node) == "realnode"  # type: ignore[arg-type]
    assert tiers.tier(item("e2e/test_real_node_cleanup.py")) == "realnode"  # type: ignore[arg-type]
    as_root = item("e2e/test_release_artifacts.py", marks=("realnode",))
    assert tiers.tier(as_root) == "realnode"  # type: ignore[arg-type]
    assert tiers.tier(item("e2e/test_release_artifacts.py")) == "e2e"  # type: ignore[arg-type]


def test_what_a_machine_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(tiers.os, "geteuid", lambda: 0)
    assert [tiers.cannot_run(t) for t in ("unit", "e2e", "realnode")] == [None, None, None]
    monkeypatch.setattr(tiers.os, "geteuid", lambda: 1000)
    assert tiers.cannot_run("e2e") is None
    assert "root" in (tiers.cannot_run("realnode") or "")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert tiers.cannot_run("unit") is None
    assert "Linux" in (tiers.cannot_run("e2e") or "")
    assert "Linux" in (tiers.cannot_run("realnode") or "")
