"""Fixtures shared by unit and end-to-end tests: the Go tools they run (a run missing some builds
them in the background while the tests that need none run first, see prebuild; it never skips)
and a private PostgreSQL server (installed first where missing, see tests.support.postgres).

The tiers (markers; README, "Tests"): `unit` (tests/unit: Python, Java and Maven, nothing else),
`e2e` (tests/e2e on the dev-cluster: a real API server and the pod simulator, on Linux) and
`realnode` (the tests on a real kubelet: root on Linux). A run leaves out the tiers this machine
cannot run and says so in one line; under CI it leaves out nothing and fails instead."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from apportion_dev.devcluster.tools import (
    ACTIONLINT,
    ARGOCD_LUA,
    HELM,
    KSTATUS,
    PROMTOOL,
    ensure_tool,
)
from tests.support import prebuild
from tests.support.postgres import PostgresServer
from tests.support.tiers import cannot_run, tier

HERE = Path(__file__).parent

# make test runs the tiers side by side on a shared machine: Hypothesis' wall-clock checks (an
# example's deadline, the too-slow health check) would fail a test for the machine's load, not
# for anything it checks.
settings.register_profile("apportion", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("apportion")

LEFT_OUT = pytest.StashKey[str]()
BACKGROUND = pytest.StashKey[prebuild.BackgroundBuild]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    prebuild.order(items)
    kept: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        name = tier(item)
        item.add_marker(getattr(pytest.mark, name))
        if name == "realnode":
            item.add_marker(pytest.mark.one_per_machine)
        (left_out if cannot_run(name) else kept).append(item)
    if not left_out:
        return
    reasons = sorted({f"{tier(i)} ({cannot_run(tier(i))})" for i in left_out})
    line = f"left out {len(left_out)} test(s) of the tiers {', '.join(reasons)}"
    if os.environ.get("CI") == "true":
        raise pytest.UsageError(f"CI runs every tier, but this machine cannot: {line}")
    config.hook.pytest_deselected(items=left_out)
    items[:] = kept
    config.stash[LEFT_OUT] = line


def pytest_collection_finish(session: pytest.Session) -> None:
    names = prebuild.missing(session.items)
    # Under pytest-xdist every worker collects the same tests: the first builds for all (the
    # others' fixtures wait on the build's file lock, apportion_dev.devcluster.build.ensure).
    first = os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"
    if names and first and not session.config.option.collectonly:
        session.config.stash[BACKGROUND] = prebuild.BackgroundBuild(names)
        print(f"\nbuilding {', '.join(names)} in the background (log: {prebuild.log_path()})")


def pytest_sessionfinish(session: pytest.Session) -> None:
    build = session.config.stash.get(BACKGROUND, None)
    if build is not None:
        build.stop()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    line = config.stash.get(LEFT_OUT, None)
    if line:
        terminalreporter.write_line(line, yellow=True, bold=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    fail_skips_under_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    fail_skips_under_ci(report)
    return report


def fail_skips_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under CI (CI=true) nothing is left out: a skip (pytest.skip, skipif, importorskip, a
    module skipped whole) or an xfail is a failure saying what would have been left out."""
    if os.environ.get("CI") != "true" or not report.skipped:
        return
    what = "xfail" if hasattr(report, "wasxfail") else "skip"
    reason = getattr(report, "wasxfail", None) or (
        report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    )
    report.outcome = "failed"
    report.longrepr = f"CI=true runs everything, but this would {what}: {reason}"


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
def kstatus_binary(request: pytest.FixtureRequest) -> Path:
    """sigs.k8s.io/cli-utils' kstatus as a command (devtools/go/kstatus; tests.support.kstatus)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        return ensure_tool(KSTATUS) / "kstatus"


@pytest.fixture(scope="session")
def argocd_lua(request: pytest.FixtureRequest) -> Path:
    """Argo CD's health checks run by Argo CD's own code (devtools/go/argocd/argocd-lua)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        return ensure_tool(ARGOCD_LUA) / "argocd-lua"


@pytest.fixture(scope="session")
def actionlint(request: pytest.FixtureRequest) -> Path:
    """rhysd/actionlint, the release workflow's checker (devtools/go/tools/actionlint)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        return ensure_tool(ACTIONLINT) / "actionlint"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server on loopback for the whole session; tests take a fresh database of
    it (`postgres.create_database(name)`) or scopes of their own."""
    with PostgresServer() as server:
        yield server
