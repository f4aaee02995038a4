"""The test tiers (tests/conftest.py, README "Tests"): which tier a test is in, and why this
machine cannot run a tier."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]
REAL_NODE_FIXTURES = {"real_cluster", "installed_operator"}


def tier(item: pytest.Item) -> str:
    """unit by place; realnode by a real-node fixture, the file name, or an explicit
    `realnode` mark (a test that needs root without a real node, e.g. buildah); else e2e."""
    if TESTS / "unit" in item.path.parents:
        return "unit"
    real = REAL_NODE_FIXTURES & set(getattr(item, "fixturenames", ()))
    marked = item.get_closest_marker("realnode") is not None
    return "realnode" if real or marked or item.path.name.startswith("test_real_node") else "e2e"


def cannot_run(tier_name: str) -> str | None:
    """Why this machine cannot run the tier, or None."""
    if tier_name == "unit":
        return None
    if not sys.platform.startswith("linux"):
        return "need Linux (loopback pod addresses, /proc)"
    if tier_name == "realnode" and os.geteuid() != 0:
        return "need root on Linux (iptables, mounts, cgroups of a kubelet)"
    return None
