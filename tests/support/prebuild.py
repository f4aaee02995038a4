"""Builds the Go tools a test run needs in the background while the tests that need none run
(tests/conftest.py): cold, the tools are a quarter of an hour of compiling that used to come
before the first test; the end-to-end tests mostly wait on the API server and their pods, so a
build at the lowest CPU priority takes the idle time instead of the tests'. The tests that need
a tool run after the others; a fixture that asks for a tool the background has not finished
waits on the same build lock (`apportion_dev.devcluster.build.ensure`), or builds it itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from apportion_dev.devcluster.build import is_built
from apportion_dev.devcluster.paths import cache_root
from apportion_dev.devcluster.tools import (
    ACTIONLINT,
    ARGOCD_LUA,
    ARGOCD_TOOLS,
    CONTAINERD,
    FLUX_TOOLS,
    HELM,
    KREW,
    KSTATUS,
    OLDEST_KUBERNETES,
    PROMTOOL,
    GoTool,
    tool_build,
)
from tests.support.tiers import tier

FIXTURE_TOOLS: dict[str, tuple[GoTool, ...]] = {
    "actionlint": (ACTIONLINT,),
    # the `health` fixture of test_argocd_health.py asks for argocd_lua by its parameter
    "argocd_lua": (ARGOCD_LUA,),
    "health": (ARGOCD_LUA,),
    "argocd": ARGOCD_TOOLS,
    "flux": FLUX_TOOLS,
    "helm_binary": (HELM,),
    "krew": (KREW,),
    "kstatus_binary": (KSTATUS,),
    "promtool": (PROMTOOL,),
    "oldest_kubernetes": (OLDEST_KUBERNETES,),
}
REAL_NODE_TOOLS = (CONTAINERD,)
LOWEST_PRIORITY = ("nice", "-n", "19")


def tools_of(item: pytest.Item) -> tuple[GoTool, ...]:
    needed = [
        tool
        for fixture in getattr(item, "fixturenames", ())
        for tool in FIXTURE_TOOLS.get(fixture, ())
    ]
    return (*needed, *(REAL_NODE_TOOLS if tier(item) == "realnode" else ()))


def order(items: list[pytest.Item]) -> None:
    """Tests without tools first, then (a module at a time, so module fixtures start once) those
    that need a tool; then the real node's, one real-node cluster per machine at a time: the
    clean-up tests, which start and kill clusters of their own, then those on several nodes
    (their module's cluster stops at the module's end), then those on the session's shared real
    node, last, so it is up as short a time as possible beside the simulator's clusters."""
    modules_with_tools = {item.path for item in items if tools_of(item)}
    real_node_order = {"test_real_node_cleanup.py": 2, "test_real_nodes.py": 3}

    def rank(item: pytest.Item) -> int:
        if tier(item) == "realnode":
            return real_node_order.get(item.path.name, 4)
        return 1 if item.path in modules_with_tools else 0

    items.sort(key=rank)


def missing(items: Iterable[pytest.Item]) -> list[str]:
    """The tools these tests need that are not built, in the order the tests need them."""
    needed = {tool.name: tool for item in items for tool in tools_of(item)}
    return [name for name, tool in needed.items() if not _built(tool)]


def _built(tool: GoTool) -> bool:
    spec = tool_build(tool)  # reads and hashes the wrapper module: once per tool, not per test
    return is_built(spec.directory, spec.stamp, spec.binaries)


def log_path() -> Path:
    return cache_root() / "test-tools-build.log"


class BackgroundBuild:
    """`apportion dev-cluster tools NAME...` at nice 19, in a session of its own."""

    def __init__(self, names: list[str]) -> None:
        log = log_path()
        log.parent.mkdir(parents=True, exist_ok=True)
        # Appended to: make test's tiers run side by side, each may start a build of its own.
        with log.open("a") as out:
            out.write(f"\n== pid {os.getpid()}: {' '.join(names)}\n")
            out.flush()
            self.process = subprocess.Popen(
                [
                    *LOWEST_PRIORITY,
                    sys.executable,
                    "-m",
                    "apportion",
                    "dev-cluster",
                    "tools",
                    *names,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> None:
        """Interrupt what is left (SIGINT: the build removes its partial output on the way out)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
