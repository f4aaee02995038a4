"""The package's import contract (README, "Layout"), read from the sources: every import
statement counts, including those inside functions; imports under `if TYPE_CHECKING:` do not
(they never run)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "operator"
PACKAGE = ROOT / "apportion"

ALLOWED: dict[str, set[str]] = {
    # layer: the apportion layers it may import (itself always)
    "api": set(),
    "engine": {"api"},
    "publishing": {"api"},
    "controllers": {"api", "engine", "publishing", "listwatch"},
    "listwatch": set(),
    "worker": {"api", "engine", "listwatch", "fencing"},
    "grains": {"api", "engine", "listwatch", "worker"},
    "kafka": {"api", "engine", "listwatch", "worker"},
    "fencing": set(),
}
ENTRY_POINTS = {"cli", "__main__"}
"""They may start anything, so they have no row above; the package's own `__init__` neither."""

KUBERNETES_CLIENTS = {"kopf", "lightkube", "kubernetes", "aiohttp", "httpx", "httpx2"}
"""What the pure engine never imports: it does no I/O and knows no API server."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[str]:
    """Absolute names of the modules `path` imports at run time."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for body in node.body for child in ast.walk(body))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], base]).strip(".")
            yield base
            # `from apportion.engine import allocation` imports the submodule too
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if (ROOT / candidate.replace(".", "/")).exists() or (
                    ROOT / (candidate.replace(".", "/") + ".py")
                ).exists():
                    yield candidate


SOURCES = sorted(PACKAGE.rglob("*.py"))
GRAPH = {module_name(p): set(imports(p)) for p in SOURCES}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "apportion" else None


LAYERED = [p for p in SOURCES if layer(module_name(p)) in ALLOWED]


def test_every_module_is_in_a_layer_or_an_entry_point() -> None:
    """So that a new package cannot escape the contract by being absent from it."""
    stray = {
        module
        for module in GRAPH
        if module != "apportion" and layer(module) not in ALLOWED.keys() | ENTRY_POINTS
    }
    assert not stray, f"add to ALLOWED (or make them entry points): {sorted(stray)}"


def test_the_product_imports_nothing_of_the_harness() -> None:
    """devtools/ (the dev-cluster, the simulator, the demo) sits on the product, never under it."""
    harness = {
        module: sorted(n for n in names if n.split(".")[0] == "apportion_dev")
        for module, names in GRAPH.items()
    }
    assert not {m: n for m, n in harness.items() if n}


@pytest.mark.parametrize("source", LAYERED, ids=lambda p: module_name(p))
def test_layers_import_only_what_the_contract_allows(source: Path) -> None:
    importer = module_name(source)
    own = layer(importer)
    assert own is not None
    broken = sorted(
        name
        for name in GRAPH[importer]
        if (target := layer(name)) is not None and target != own and target not in ALLOWED[own]
    )
    assert not broken, f"{importer} ({own}) must not import {broken}"


def test_the_engine_imports_no_kubernetes_client() -> None:
    offending = {
        module: sorted(n for n in names if n.split(".")[0] in KUBERNETES_CLIENTS)
        for module, names in GRAPH.items()
        if layer(module) == "engine"
    }
    assert not {m: n for m, n in offending.items() if n}


IO_MODULES = {
    "asyncio",
    "http",
    "io",
    "os",
    "pathlib",
    "selectors",
    "shutil",
    "signal",
    "socket",
    "ssl",
    "subprocess",
    "tempfile",
    "threading",
    "time",
    "urllib",
}
"""What would let the engine touch files, the network, processes or the clock: it takes its
inputs and its time as arguments (entry points, read from installed metadata, are its one way
out, to load a user's strategy)."""


def test_the_engine_does_no_io() -> None:
    offending = {
        module: sorted(n for n in names if n.split(".")[0] in IO_MODULES)
        for module, names in GRAPH.items()
        if layer(module) == "engine"
    }
    assert not {m: n for m, n in offending.items() if n}


def test_fencing_sits_on_the_standard_library_and_psycopg_alone() -> None:
    """Any process holding tokens may use it: no Kubernetes client, nothing of apportion."""
    names = {name.split(".")[0] for name in GRAPH["apportion.fencing"]}
    assert "psycopg" in names
    assert names - {"psycopg"} <= sys.stdlib_module_names


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over the package's module graph: every
    component is a single module."""
    edges = {m: {n for n in names if n in GRAPH and n != m} for m, names in GRAPH.items()}
    # a package's __init__ re-exports its modules; importing `apportion.x.y` runs `apportion.x`
    # first, but that is Python's order, not a dependency of y on its package: drop those edges
    for m in edges:
        edges[m] = {n for n in edges[m] if not m.startswith(n + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_contract_sees_imports_inside_functions() -> None:
    """The checker must be able to fail: a lazy import inside a function counts."""
    assert "apportion.grains._watch" in GRAPH["apportion.grains._director"]
    assert "apportion.engine.allocation.registry" in GRAPH["apportion.engine.allocation.from_spec"]


OPERATOR_ONLY = {"kopf", "prometheus_client"}
"""The `operator` extra: what only the operator's process imports, so that a worker image with
`pip install apportion` (no extras) runs every other module."""


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: module_name(p))
def test_only_the_operator_needs_the_operator_extra(source: Path) -> None:
    importer = module_name(source)
    if layer(importer) == "controllers" or importer == "apportion.cli.operator":
        return
    needs = {name for name in GRAPH[importer] if name.split(".")[0] in OPERATOR_ONLY}
    assert not needs, f"{importer} imports {sorted(needs)}: only the operator may need its extra"
