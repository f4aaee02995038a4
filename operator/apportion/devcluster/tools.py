"""Build the Go tools the tests run (promtool) from the Go wrapper module tests/e2e/tools.

Like the control plane (`build`): `GOTOOLCHAIN=local`, `CGO_ENABLED=0`, `-trimpath`, into
~/.cache/apportion/tools/<tool>-<version>/ with a stamp file recording the go.sum it was built
from; a build happens only when the binary is missing or the stamp differs, under a file lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from apportion.devcluster.build import (
    STAMP_FILE,
    Progress,
    _elapsed,
    _lock,
    _run_go,
    _stderr_progress,
    check_go,
    read_stamp,
)
from apportion.devcluster.paths import DevClusterError, cache_root, parse_go_version

TOOLS = {"promtool": ("github.com/prometheus/prometheus", "cmd/promtool")}
"""tool name → (Go module pinned in the wrapper's go.mod, package path inside it)."""


def tools_module() -> Path:
    """$APPORTION_TOOLS_MODULE, else tests/e2e/tools beside the package in a source checkout."""
    override = os.environ.get("APPORTION_TOOLS_MODULE")
    path = (
        Path(override)
        if override
        else Path(__file__).resolve().parents[3] / "tests" / "e2e" / "tools"
    )
    if not (path / "go.mod").is_file():
        raise DevClusterError(
            f"the tools Go module is not at {path}; run from a source checkout of apportion or "
            "set APPORTION_TOOLS_MODULE to its directory"
        )
    return path


def pinned(module: Path, go_module: str) -> tuple[str, tuple[int, ...]]:
    """The version of `go_module` the wrapper's go.mod requires, and its minimum Go."""
    version = None
    go = None
    for line in (module / "go.mod").read_text().splitlines():
        words = line.split()
        if words[:1] == ["go"] and len(words) == 2:
            go = parse_go_version(words[1])
        if go_module in words:
            version = words[words.index(go_module) + 1]
    if version is None or go is None:
        raise DevClusterError(f"{module / 'go.mod'} does not pin {go_module} and a go version")
    return version, go


def ensure_tool(name: str, progress: Progress | None = None) -> Path:
    """The path of tool `name`, built first when it is missing or was built from another
    go.sum."""
    progress = progress or _stderr_progress
    go_module, package = TOOLS[name]
    module = tools_module()
    version, minimum_go = pinned(module, go_module)
    target = cache_root() / "tools" / f"{name}-{version}"
    expected = {
        "module": go_module,
        "version": version,
        "flags": ["-trimpath", "-ldflags=-s -w"],
        "env": {"GOTOOLCHAIN": "local", "CGO_ENABLED": "0"},
        "go.sum": hashlib.sha256((module / "go.sum").read_bytes()).hexdigest(),
    }
    if _built(target, name, expected):
        return target / name
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f".{target.name}.lock", progress):
        if not _built(target, name, expected):
            go = check_go(minimum_go)
            started = time.monotonic()
            progress(f"building {name} {version} into {target} (first time only)")
            partial = target.parent / f"{target.name}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            try:
                _run_go(
                    [
                        go,
                        "build",
                        "-trimpath",
                        "-ldflags",
                        "-s -w",
                        "-o",
                        f"{partial}/",
                        f"{go_module}/{package}",
                    ],
                    module,
                    progress,
                    started,
                )
                target.mkdir(exist_ok=True)
                os.replace(partial / name, target / name)
                (target / STAMP_FILE).write_text(json.dumps(expected, indent=2) + "\n")
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            progress(f"done in {_elapsed(started)}: {target / name}")
    return target / name


def _built(target: Path, name: str, expected: dict[str, object]) -> bool:
    stamp = read_stamp(target)
    return (
        stamp is not None
        and {key: stamp.get(key) for key in expected} == expected
        and os.access(target / name, os.X_OK)
    )
