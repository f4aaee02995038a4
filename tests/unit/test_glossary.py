"""docs/glossary.md names the one type that carries each word, and those names stay true: every
`apportion.…` path it quotes imports, every word of its tables names one, and every type that
stands for a pod in some role (its name says Member, Pod, Incarnation or Candidate) is in it —
a new or renamed one fails here until the glossary says which role it plays."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

GLOSSARY = Path(__file__).resolve().parents[2] / "docs" / "glossary.md"
PATH = re.compile(r"`(apportion(?:\.[A-Za-z_]\w*)+)`")
# The packages whose types play a pod's roles; cli only wires them, kafka and fencing own none.
SEARCHED = (
    "apportion.api",
    "apportion.engine",
    "apportion.controllers",
    "apportion.publishing",
    "apportion.worker",
    "apportion.grains",
)
POD_WORDS = {"Member", "Pod", "Incarnation", "Candidate"}


def resolve(path: str) -> object:
    """The module or attribute `path` names: its longest importable prefix, then attributes."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(path)


def named_paths(text: str) -> list[str]:
    return sorted(set(PATH.findall(text)))


def typed_cells(text: str) -> dict[str, str]:
    """Each table row's first cell → its cell under the "carried by" or "type" header."""
    cells: dict[str, str] = {}
    column: int | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if column is None:
            column = next(i for i, title in enumerate(row) if title in ("carried by", "type"))
        elif not row[0].startswith("---"):
            cells[row[0]] = row[column]
    return cells


def modules(package: str) -> list[ModuleType]:
    root = importlib.import_module(package)
    found = [root]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not info.name.endswith("__main__"):
            found.append(importlib.import_module(info.name))
    return found


def pod_role_types() -> dict[str, type]:
    """Public classes defined in SEARCHED whose CamelCase words include one of POD_WORDS;
    exceptions are errors about members, not members."""
    types: dict[str, type] = {}
    for package in SEARCHED:
        for module in modules(package):
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if (
                    cls.__module__ == module.__name__
                    and not name.startswith("_")
                    and not issubclass(cls, BaseException)
                    and POD_WORDS & set(re.findall(r"[A-Z][a-z]*", name))
                ):
                    types[f"{module.__name__}.{name}"] = cls
    return types


def test_every_named_path_resolves() -> None:
    paths = named_paths(GLOSSARY.read_text())
    assert len(paths) > 30
    unresolved = []
    for path in paths:
        try:
            resolve(path)
        except (ImportError, AttributeError) as error:
            unresolved.append(f"{path}: {error}")
    assert not unresolved, "docs/glossary.md names what does not exist:\n" + "\n".join(unresolved)


def test_every_word_names_its_type() -> None:
    cells = typed_cells(GLOSSARY.read_text())
    assert len(cells) > 25
    untyped = [word for word, cell in cells.items() if not PATH.search(cell)]
    # apportion_dev's dev-cluster is the harness's, quoted by its own package name.
    assert untyped == ["**dev-cluster**"]


def test_every_pod_role_type_is_in_the_glossary() -> None:
    named = {id(resolve(path)) for path in named_paths(GLOSSARY.read_text())}
    types = pod_role_types()
    # The rule finds the family it is written for; an empty search would pass vacuously.
    assert {"apportion.api.pods.WorkerPod", "apportion.engine.allocation.model.Member"} <= set(
        types
    )
    missing = sorted(path for path, cls in types.items() if id(cls) not in named)
    assert not missing, "types for a pod in some role that docs/glossary.md does not name: " + (
        ", ".join(missing)
    )
