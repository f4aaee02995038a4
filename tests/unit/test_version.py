"""The version is kept in VERSION alone: the installed distributions read it, and every literal
the tree keeps for tools that cannot read a file (the chart, the kustomization's image tag, the
samples, the krew manifest, Maven's ${revision}) says the same. `drifted` is what
scripts/release.py refuses a release on; here it runs on the tree, and on copies with one literal
changed to show it can fail."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
from pathlib import Path

import pytest

import apportion
from tests.support import release

REPO = release.REPO
rel = release.load()


def test_the_installed_distributions_carry_the_version_file() -> None:
    version = (REPO / "VERSION").read_text().strip()
    assert rel.read_version() == version
    assert apportion.__version__ == version
    assert importlib.metadata.version("apportion") == version
    assert importlib.metadata.version("apportion-devtools") == version


def test_no_second_literal_in_the_package_or_the_java_modules() -> None:
    init = (REPO / "operator" / "apportion" / "__init__.py").read_text()
    assert not re.search(r"__version__\s*=\s*['\"]", init)
    for module in rel.JAVA_MODULES.values():
        pom = (module / "pom.xml").read_text()
        assert not re.search(r"<version>\d+\.\d+\.\d+(-SNAPSHOT)?</version>\s*<packaging>", pom)
        assert "<version>${revision}</version>" in pom, module


def test_every_literal_in_the_tree_agrees_with_version() -> None:
    assert rel.drifted(rel.read_version()) == []


def _copy_tree_literals(root: Path) -> None:
    for literal in rel.LITERALS:
        for path in REPO.glob(literal.glob):
            target = root / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


@pytest.mark.parametrize("literal", rel.LITERALS, ids=lambda lit: f"{lit.glob}:{lit.pattern[:20]}")
def test_a_literal_that_drifts_is_named(literal, tmp_path: Path) -> None:
    _copy_tree_literals(tmp_path)
    version = rel.read_version()
    assert rel.drifted(version, tmp_path) == []
    path = sorted(tmp_path.glob(literal.glob))[-1]
    text = path.read_text()
    match = re.search(literal.pattern, text, re.M)
    assert match is not None
    path.write_text(text[: match.start("v")] + "9.9.9" + text[match.end("v") :])
    where = path.relative_to(tmp_path)
    assert rel.drifted(version, tmp_path) == [f"{where}: says 9.9.9, VERSION says {version}"]


def test_a_literal_that_vanished_is_named(tmp_path: Path) -> None:
    _copy_tree_literals(tmp_path)
    (tmp_path / "manifests" / "kustomization.yaml").write_text("images: []\n")
    problems = rel.drifted(rel.read_version(), tmp_path)
    assert len(problems) == 1
    assert problems[0].startswith("manifests/kustomization.yaml: no version matching")


def test_a_version_file_that_is_no_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / "VERSION").write_text("v1.2\n")
    with pytest.raises(rel.ReleaseError, match="not a version"):
        rel.read_version(tmp_path)


def test_stamping_a_version_changes_every_literal_and_nothing_else(tmp_path: Path) -> None:
    _copy_tree_literals(tmp_path)
    (tmp_path / "VERSION").write_text((REPO / "VERSION").read_text())
    old, new = rel.read_version(), "7.8.9"
    before = {p: p.read_text() for p in tmp_path.rglob("*") if p.is_file()}
    changed = rel.stamp(new, tmp_path)
    assert rel.drifted(new, tmp_path) == []
    assert len(rel.drifted(old, tmp_path)) >= len(rel.LITERALS)
    assert set(changed) == {p for p, text in before.items() if p.read_text() != text}
    assert {p.relative_to(tmp_path).as_posix() for p in changed} >= {"VERSION", "pom.xml"}
    for path, text in before.items():  # only the version moved, nothing around it
        assert path.read_text().replace(new, old) == text, path
    assert "<revision>7.8.9-SNAPSHOT</revision>" in (tmp_path / "pom.xml").read_text()


def test_stamping_no_version_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    _copy_tree_literals(tmp_path)
    (tmp_path / "VERSION").write_text("1.2.3\n")
    with pytest.raises(rel.ReleaseError, match="not a version"):
        rel.stamp("1.2", tmp_path)
    assert (tmp_path / "VERSION").read_text() == "1.2.3\n"
