"""scripts/release.py as a module, for the tests of its pure parts and the release itself, and
a release of this checkout at another version (`stamped`)."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "release.py"


def load() -> ModuleType:
    if "release" in sys.modules:
        return sys.modules["release"]
    spec = importlib.util.spec_from_file_location("release", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def stamped(work: Path, version: str, steps: Sequence[str], revision: str | None = None) -> Path:
    """`make release` of this checkout (or of its commit `revision`) as it would be cut at
    `version`, nothing in the checkout changed: its files (the working tree's, committed or not,
    or the commit's) copied into `work`/tree, stamped (`stamp`, of this checkout's release.py: an
    older tree may lack it), committed there (a release records its revision) and released with
    `steps` into `work`/dist, which is returned. The copy's own code runs it (its devtools and
    package first on PYTHONPATH): an older tree's images come from its own Dockerfile. A version
    nothing else has makes anything a test later installs of it come from that dist/ alone."""
    tree = work / "tree"
    tree.mkdir(parents=True)
    if revision is None:
        _copy_working_tree(tree)
    else:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", revision], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    load().stamp(version, tree)
    git = ["git", "-c", "user.name=release", "-c", "user.email=release@apportion.invalid"]
    run = functools.partial(subprocess.run, cwd=tree, check=True, capture_output=True, text=True)
    run(["git", "init", "-q"])
    run(["git", "add", "-A"])
    run([*git, "commit", "-q", "-m", f"Release {version}"])
    changelog = work / "CHANGELOG.md"
    changelog.write_text(f"# Changelog\n\n## [{version}] - 2026-11-28\n\n- Cut by a test.\n")
    dist = work / "dist"
    script = tree / "scripts" / "release.py"
    argv = [sys.executable, str(script), "--version", version, "--dist", str(dist)]
    paths = os.pathsep.join([str(tree / "devtools"), str(tree / "operator")])
    result = subprocess.run(
        [*argv, "--changelog", str(changelog), *(f"--only={step}" for step in steps)],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": paths},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return dist


def _copy_working_tree(tree: Path) -> None:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in the index
        target = tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
