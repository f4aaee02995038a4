"""Fixtures shared by unit and end-to-end tests: the Go tools they run (built by `make tools`; a
test run on a machine without them builds them first, it never skips) and a private PostgreSQL
server (installed first where missing, see postgres_support)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_support import PostgresServer

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


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server on loopback for the whole session; tests take a fresh database of
    it (`postgres.create_database(name)`) or scopes of their own."""
    with PostgresServer() as server:
        yield server
