"""Docs name only what exists: every `apportion.x.y` path in README.md and docs/*.md imports
(or is an attribute of what imports, or is a name the code spells out, as entry-point groups),
every source file path and relative link resolves, and every Python name a doc puts in code
quotes (`snake_case` or `called(...)`) is defined or spelled out in the package or its tests."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "apportion"
HARNESS = REPO / "devtools" / "apportion_dev"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# Not inside a longer name: `dev.apportion.client` is a Java package, `keys/apportion.json` a file.
DOTTED = re.compile(r"(?<![\w./-])apportion(?:_dev)?(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
SOURCE = re.compile(r"^[\w./-]*[\w-]+\.(?:py|md|yaml|yml|java|toml|c|sh|xml)$")
TOP = (
    "operator/",
    "devtools/",
    "docs/",
    "tests/",
    "bench/",
    "manifests/",
    "crds/",
    "scripts/",
    ".ci/",
)
LAYERS = ("api/", "engine/", "controllers/", "publishing/", "worker/", "grains/", "cli/")
CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)\(")
SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
# Names a string literal defines: an SQL table, a key of a TOML or INI text.
DEFINED_IN_TEXT = re.compile(
    r"(?:\b(?:TABLE(?: IF NOT EXISTS)?|INTO|FROM) |^\s*)([a-z_][\w]*)(?= |\s*=)", re.M
)

OUTSIDE = {
    # Names of other projects the docs quote (kopf, lightkube, Kubernetes, Python, the JVM),
    # and the factory a user's plug-in defines (docs/placement.md).
    "make",
    "create_namespaced_resource",
    "server_timeout",
    "field_manager",
    "insecure_skip_tls_verify",
    "asyncio_mode",
    "min_nr_of_members",
    "max_connections",
}


def defined_names() -> set[str]:
    """Every name the package and its tests define or spell out: modules, functions, classes,
    their attributes and parameters, constants, and string literals."""
    names: set[str] = set()
    for path in [*PACKAGE.rglob("*.py"), *HARNESS.rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        if path == Path(__file__).resolve():
            continue
        names.add(path.stem)
        names.add(path.parent.name)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    names.add(arg.arg)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # A string that is a name as a whole (a dict key, an entry-point group, a field
                # or flag name), not any word inside a message.
                if re.fullmatch(r"-{0,2}[A-Za-z_][\w.-]*", node.value):
                    names.add(node.value.lstrip("-").replace("-", "_"))
                    names.add(node.value)
                names.update(DEFINED_IN_TEXT.findall(node.value))
    return names


def references() -> Iterator[tuple[str, str, str]]:
    """(doc, kind, text) for each reference to check."""
    for doc in DOCS:
        text = doc.read_text()
        for code in CODE.findall(text):
            for dotted in DOTTED.findall(code):
                if not dotted.startswith("apportion.dev"):  # the API group
                    yield doc.name, "dotted", dotted
            word = code.strip()
            if SOURCE.match(word) or (word.startswith(TOP + LAYERS) and " " not in word):
                yield doc.name, "path", word
            call = CALL.match(word)
            if call and "." not in call.group(1):
                yield doc.name, "name", call.group(1)
            elif SNAKE.match(word):
                yield doc.name, "name", word
        for target in LINK.findall(text):
            if not target.startswith(("http://", "https://", "mailto:")) and "[" not in target:
                yield doc.name, "link", target


def resolves(dotted: str) -> bool:
    if dotted in NAMES:  # spelled out by the code, e.g. an entry-point group
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def path_exists(doc: str, path: str) -> bool:
    """Relative to the repository, the doc, or the package (`controllers/unitsets/loop.py`); a bare
    file name anywhere in the sources (`_keys.c`)."""
    path = path.rstrip("/")
    bases = [REPO, REPO / "docs", PACKAGE, HARNESS, REPO / "operator", REPO / "tests"]
    if any((base / path).exists() for base in bases):
        return True
    return "/" not in path and any(
        not found.is_relative_to(REPO / ".venv") for found in REPO.rglob(path)
    )


NAMES = defined_names()
REFERENCES = sorted(set(references()))


def test_the_docs_reference_something() -> None:
    kinds = {kind for _, kind, _ in REFERENCES}
    assert kinds == {"dotted", "path", "name", "link"}
    assert len(REFERENCES) > 100


@pytest.mark.parametrize(("doc", "kind", "text"), REFERENCES)
def test_reference_exists(doc: str, kind: str, text: str) -> None:
    if kind == "dotted":
        assert resolves(text), f"{doc} names {text}, which does not exist"
    elif kind in ("path", "link"):
        assert path_exists(doc, text), f"{doc} names the path {text}, which does not exist"
    else:
        assert text in NAMES or text in OUTSIDE, f"{doc} names {text}, defined nowhere"


def test_the_check_catches_a_missing_module_path_and_name() -> None:
    assert not resolves("apportion.controllers.status")
    assert not resolves("apportion.publishing.placement_table.WRITES")
    assert resolves("apportion.controllers.caches.SelectedCache.want")
    assert not path_exists("operator.md", "controllers/status.py")
    assert "find_ghosts" not in NAMES
    assert "plan_pass" in NAMES
