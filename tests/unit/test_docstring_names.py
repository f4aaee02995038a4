"""Docstrings name only what exists. In every module, class and function docstring (and the
attribute docstrings after an assignment) of `apportion` and `apportion_dev`:

- every dotted `apportion.…` / `apportion_dev.…` path imports, or is an attribute of what does;
- every backticked dotted name whose first part is a name of the module (defined or imported
  there) or a module of the package (`engine.keys`, `leadership.LeaderElection` beside it)
  resolves to a module or attribute;
- every backticked CamelCase name (`Worker`, `PublishConflict`) is defined or imported in the
  module, or defined somewhere in the two packages, or is outside vocabulary (Kubernetes kinds,
  listed below)."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"apportion": REPO / "operator" / "apportion", "apportion_dev": REPO / "devtools"}

DOTTED = re.compile(
    r"(?<![\w./-])apportion(?:_dev)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?![\w/-])(?!\.[A-Za-z])"
)
BACKTICKED = re.compile(r"`([^`\n]+)`")
DOTTED_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(.*\))?")
CAMEL = re.compile(r"([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)(?:\(.*\))?")

OUTSIDE = {
    # Names of other projects the docstrings compare with: client-go's rate limiters, Pekko's
    # shard allocation strategies and hash, Orleans' load shedding, psycopg's connection.
    "BucketRateLimiter",
    "ItemExponentialFailureRateLimiter",
    "MaxOfRateLimiter",
    "ConsistentHashingShardAllocationStrategy",
    "ExternalShardAllocationStrategy",
    "LeastShardAllocationStrategy",
    "ShardSuitabilityOrdering",
    "Fnv1aHashHelper",
    "LoadSheddingOptions",
    "AsyncConnection",
}
API_GROUP = "apportion.dev"


def module_files() -> Iterator[tuple[str, Path]]:
    for package, root in ROOTS.items():
        base = root if package == "apportion" else root / "apportion_dev"
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base.parent).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join(parts), path


MODULES = dict(module_files())


def docstrings(tree: ast.Module) -> Iterator[str]:
    """Module, class and function docstrings, and the strings after an assignment."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                yield statement.value.value


def defined_anywhere() -> set[str]:
    """Names the two packages define or import, and the strings they spell out as a whole
    name (a condition reason such as "InvalidSpec", an entry-point group)."""
    names: set[str] = set()
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[-1])
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", node.value)
            ):
                names.add(node.value)
    return names


DEFINED = defined_anywhere()


def load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def attribute_chain(obj: object, parts: list[str]) -> bool:
    for part in parts:
        if not hasattr(obj, part):
            # a module's submodule need not be imported yet
            if isinstance(obj, ModuleType) and load(f"{obj.__name__}.{part}") is not None:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
                continue
            # a dataclass field or a slot without a default is an annotation of the class
            return part in getattr(obj, "__annotations__", {})
        obj = getattr(obj, part)
    return True


def resolves_dotted(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = load(".".join(parts[:cut]))
        if module is not None:
            return attribute_chain(module, parts[cut:])
    return False


def namespace(module_name: str, path: Path) -> dict[str, object]:
    """The module's names: its globals once imported (an entry point's `__main__` is read,
    not run), and what it imports under TYPE_CHECKING or inside functions, by name."""
    names: dict[str, object] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                names[alias.asname or top] = load(alias.name if alias.asname else top)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            source = load(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(source, alias.name, None) or load(
                    f"{node.module}.{alias.name}"
                )
    if not module_name.endswith("__main__"):
        names.update(vars(importlib.import_module(module_name)))
    return names


def package_relative(module_name: str, dotted: str) -> bool | None:
    """Whether `dotted` resolves as a path inside the package (from its root or beside the
    module); None when it need not: its first part is no module of the package, or is a plain
    module followed by a lowercase name (`table.members` is as likely a variable's attribute)."""
    root = module_name.split(".")[0]
    path = MODULES[module_name]
    package = module_name if path.name == "__init__.py" else module_name.rpartition(".")[0]
    first, second = dotted.split(".")[:2]
    bases = [b for b in (root, package) if f"{b}.{first}" in MODULES]
    is_package = any(MODULES[f"{b}.{first}"].name == "__init__.py" for b in bases)
    if not bases or (not is_package and second[0].islower()):
        return None
    return any(resolves_dotted(f"{base}.{dotted}") for base in bases)


def unresolved(module_name: str, path: Path) -> Iterator[str]:
    names = namespace(module_name, path)
    for text in docstrings(ast.parse(path.read_text(), str(path))):
        for dotted in DOTTED.findall(text):
            if dotted != API_GROUP and dotted not in DEFINED and not resolves_dotted(dotted):
                yield dotted
        for quoted in BACKTICKED.findall(text):
            quoted = quoted.strip()
            if match := DOTTED_NAME.fullmatch(quoted):
                dotted = match.group(1)
                if dotted.startswith(("apportion.", "apportion_dev.")):
                    continue  # checked above
                first, *rest = dotted.split(".")
                if first in names and names[first] is not None:
                    if not attribute_chain(names[first], rest):
                        yield dotted
                elif package_relative(module_name, dotted) is False:
                    yield dotted
            elif match := CAMEL.fullmatch(quoted):
                name = match.group(1)
                if name not in names and name not in DEFINED and name not in OUTSIDE:
                    yield name


@pytest.mark.parametrize("module_name", sorted(MODULES))
def test_docstrings_name_what_exists(module_name: str) -> None:
    stale = sorted(set(unresolved(module_name, MODULES[module_name])))
    assert not stale, f"{module_name}: docstrings name {stale}, which do not exist"
