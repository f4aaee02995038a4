"""Fixtures shared by unit and end-to-end tests: the Go tools they run (built by `make tools`; a
test run on a machine without them builds them first, it never skips)."""

from __future__ import annotations

from pathlib import Path

import pytest

from apportion.devcluster.tools import HELM, PROMTOOL, ensure_tool


@pytest.fixture(scope="session")
def promtool(request: pytest.FixtureRequest) -> Path:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # a first build takes minutes: show its progress
        return ensure_tool(PROMTOOL) / "promtool"


@pytest.fixture(scope="session")
def helm_binary(request: pytest.FixtureRequest) -> Path:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        return ensure_tool(HELM) / "helm"
