"""Build the dev-cluster's Go programs from wrapper modules: etcd, kube-apiserver,
kube-controller-manager, kubectl, kubelet, kube-scheduler, kube-proxy and metrics-server from the
control-plane module, and the real node's containerd from a module of its own.

One `go build` per module (the Kubernetes binaries share most packages), with
`GOTOOLCHAIN=local` so Go never downloads a toolchain, `CGO_ENABLED=0` and `-trimpath` so the
binaries do not depend on this machine, and `-ldflags -X` version stamps so `/version` and
`kubectl version` say v1.37.2 rather than v0.0.0-master. A stamp file records what was built; a
build happens only when it is missing or differs, under a file lock so two test runs on a fresh
machine build once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from apportion_dev.devcluster.paths import (
    BINARIES,
    DevClusterError,
    ModuleVersions,
    bin_dir,
    module_dir,
    module_versions,
    parse_go_version,
)

STAMP_FILE = "build-stamp.json"
TARGETS = (
    "k8s.io/kubernetes/cmd/kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager",
    "k8s.io/kubernetes/cmd/kubectl",
    "k8s.io/kubernetes/cmd/kubelet",
    "k8s.io/kubernetes/cmd/kube-scheduler",
    "k8s.io/kubernetes/cmd/kube-proxy",
    "./etcd",
    "sigs.k8s.io/metrics-server/cmd/metrics-server",
)
PROGRESS_INTERVAL = 15.0

Progress = Callable[[str], None]


def _stderr_progress(message: str) -> None:
    print(f"[dev-cluster build] {message}", file=sys.stderr, flush=True)


def version_ldflags(kubernetes: str, build_date: str) -> list[str]:
    """`-X` stamps for both version packages (servers read component-base, kubectl's client half
    reads client-go). The module proxy does not tell us the release's commit, so gitCommit is left
    empty rather than upstream's unexpanded `$Format:%H$` placeholder. metrics-server has no
    version package of its own: its `--version` prints client-go's, so it says v1.37.2 here, the
    libraries it was built on (upstream stamps client-go with its own release, which one build of
    eight binaries cannot)."""
    major, minor = re.match(r"v(\d+)\.(\d+)", kubernetes).groups()  # type: ignore[union-attr]
    stamps = {
        "gitVersion": kubernetes,
        "gitMajor": major,
        "gitMinor": minor,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": build_date,
    }
    return [
        f"-X {package}.{name}={value}"
        for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
        for name, value in stamps.items()
    ]


def build_stamp(versions: ModuleVersions, module: Path) -> dict[str, object]:
    """What a cached build must match; go.sum's hash catches any dependency change."""
    return {
        "kubernetes": versions.kubernetes,
        "etcd": versions.etcd,
        "metrics-server": versions.metrics_server,
        "targets": list(TARGETS),
        "flags": ["-trimpath", "-ldflags=-s -w <version stamps>"],
        "env": {"GOTOOLCHAIN": "local", "CGO_ENABLED": "0"},
        "go.sum": hashlib.sha256((module / "go.sum").read_bytes()).hexdigest(),
    }


def read_stamp(directory: Path) -> dict[str, object] | None:
    try:
        stamp: dict[str, object] = json.loads((directory / STAMP_FILE).read_text())
        return stamp
    except (OSError, ValueError):
        return None


def is_built(
    directory: Path, expected: dict[str, object], binaries: tuple[str, ...] = BINARIES
) -> bool:
    stamp = read_stamp(directory)
    if stamp is None or {key: stamp.get(key) for key in expected} != expected:
        return False
    return all(os.access(directory / name, os.X_OK) for name in binaries)


@dataclass(frozen=True)
class GoBuild:
    """One `go build` of a wrapper module into a cache directory, and what a cached result must
    match to be reused."""

    what: str  # for progress lines: "Kubernetes v1.37.2 and etcd v3.7.0"
    module: Path
    targets: tuple[str, ...]
    binaries: tuple[str, ...]
    directory: Path
    stamp: dict[str, object]
    go_minimum: tuple[int, ...]
    dated_module: str  # the module whose publication time is the build date
    ldflags: Callable[[str], list[str]]  # build date -> extra -ldflags


def control_plane_build() -> GoBuild:
    module = module_dir()
    versions = module_versions(module)
    return GoBuild(
        what=(
            f"Kubernetes {versions.kubernetes}, etcd {versions.etcd} and metrics-server "
            f"{versions.metrics_server}"
        ),
        module=module,
        targets=TARGETS,
        binaries=BINARIES,
        directory=bin_dir(versions),
        stamp=build_stamp(versions, module),
        go_minimum=versions.go,
        dated_module="k8s.io/kubernetes",
        ldflags=lambda date: version_ldflags(versions.kubernetes, date),
    )


def ensure_built(progress: Progress | None = None) -> Path:
    """Return the directory holding the control-plane and node binaries, building them first if
    they are missing or were built from a different go.mod/go.sum."""
    return ensure(control_plane_build(), progress)


def ensure(spec: GoBuild, progress: Progress | None = None) -> Path:
    """Return `spec.directory`, building it first unless a matching build is cached there."""
    progress = progress or _stderr_progress
    if is_built(spec.directory, spec.stamp, spec.binaries):
        return spec.directory
    spec.directory.parent.mkdir(parents=True, exist_ok=True)
    with _lock(spec.directory.parent / f".{spec.directory.name}.lock", progress):
        # another process may have built it while we waited
        if not is_built(spec.directory, spec.stamp, spec.binaries):
            _build(spec, progress)
    return spec.directory


@contextlib.contextmanager
def _lock(path: Path, progress: Progress) -> Iterator[None]:
    with path.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("another build of the same version is running; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def check_go(minimum: tuple[int, ...]) -> str:
    """Return the `go` executable, or fail with how to get a suitable one."""
    go = shutil.which("go")
    need = ".".join(map(str, minimum))
    if go is None:
        raise DevClusterError(
            f"`go` is not on PATH. Building the dev-cluster control plane needs Go >= {need}: "
            "install it from https://go.dev/dl/ and put its bin directory on PATH."
        )
    result = subprocess.run(
        [go, "env", "GOVERSION"], capture_output=True, text=True, env=go_env(), check=False
    )
    if result.returncode != 0:
        raise DevClusterError(f"`{go} env GOVERSION` failed: {result.stderr.strip()}")
    have = parse_go_version(result.stdout)
    if have < minimum:
        raise DevClusterError(
            f"{go} is {result.stdout.strip()}, but the control-plane module needs Go >= {need} "
            "(GOTOOLCHAIN=local: no toolchain is downloaded). Install a newer Go from "
            "https://go.dev/dl/."
        )
    return go


def go_env() -> dict[str, str]:
    return {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}


def _build(spec: GoBuild, progress: Progress) -> None:
    go = check_go(spec.go_minimum)
    module, target = spec.module, spec.directory
    started = time.monotonic()
    progress(
        f"building {spec.what} into {target} "
        "(first time only: several minutes and a few GB of Go caches)"
    )
    progress("resolving packages and downloading modules…")
    listing = _run_go(
        [go, "list", "-deps", "-f", "{{.ImportPath}}", *spec.targets], module, progress, started
    )
    total = sum(1 for line in listing if line and not line.startswith("go: "))
    build_date = _run_go(
        [go, "list", "-m", "-f", '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}', spec.dated_module],
        module,
        progress,
        started,
    )[-1]
    partial = target.parent / f"{target.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        ldflags = " ".join(["-s", "-w", *spec.ldflags(build_date)])
        # One program is written under its binary's name: a main package's directory need not
        # be (Argo CD's is `cmd`).
        one = len(spec.targets) == 1 and len(spec.binaries) == 1
        output = f"{partial}/{spec.binaries[0]}" if one else f"{partial}/"
        progress(f"compiling and linking ({total} packages)…")
        _run_go(
            [go, "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", output, *spec.targets],
            module,
            progress,
            started,
            total=total,
        )
        target.mkdir(exist_ok=True)
        for name in spec.binaries:
            # rename, never overwrite in place: a running dev-cluster may be executing the old file
            os.replace(partial / name, target / name)
        (target / STAMP_FILE).write_text(
            json.dumps({**spec.stamp, "buildDate": build_date}, indent=2) + "\n"
        )
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    progress(f"done in {_elapsed(started)}: {', '.join(spec.binaries)} in {target}")


def _run_go(
    argv: list[str],
    module: Path,
    progress: Progress,
    started: float,
    total: int | None = None,
) -> list[str]:
    """Run a go command, reporting progress every PROGRESS_INTERVAL seconds from its output
    lines (`go build -v` prints one package per line); return stdout's lines."""
    process = subprocess.Popen(
        argv,
        cwd=module,
        env=go_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tail: deque[str] = deque(maxlen=40)
    counts = {"lines": 0, "downloads": 0}
    stdout_lines: list[str] = []

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            line = line.rstrip()
            tail.append(line)
            if line.startswith("go: downloading"):
                counts["downloads"] += 1
            elif not line.startswith("go: "):
                counts["lines"] += 1

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_INTERVAL):
            work = (
                f"{counts['lines']} of {total} packages compiled so far (the rest come from the "
                "Go build cache), then linking"
                if total
                else "resolving"
            )
            downloads = f", {counts['downloads']} modules downloaded" if counts["downloads"] else ""
            progress(f"still working ({_elapsed(started)}): {work}{downloads}")

    ticker = threading.Thread(target=report, daemon=True)
    ticker.start()
    try:
        assert process.stdout is not None
        stdout_lines = [line.rstrip("\n") for line in process.stdout]
        returncode = process.wait()
        reader.join()
    finally:
        done.set()
        if process.poll() is None:
            process.kill()
            process.wait()
    if returncode != 0:
        raise DevClusterError(explain_go_failure(argv, list(tail)))
    return stdout_lines


_NETWORK = re.compile(
    r"dial tcp|no such host|connection refused|i/o timeout|TLS handshake timeout|"
    r"proxyconnect|network is unreachable|server misbehaving|unexpected EOF|"
    r"Service Unavailable|Bad Gateway"
)


def explain_go_failure(argv: list[str], tail: list[str]) -> str:
    """Turn a failed go command's last output lines into a message that says what to fix."""
    output = "\n".join(tail)
    proxy = os.environ.get("GOPROXY") or "https://proxy.golang.org,direct"
    if "GOPROXY=off" in output or "module lookup disabled" in output:
        cause = (
            "modules are missing from the Go module cache and downloading is disabled "
            "(GOPROXY=off or GOFLAGS=-mod=…); allow access to a module proxy for the first build"
        )
    elif _NETWORK.search(output):
        cause = (
            f"the Go module proxy is unreachable (GOPROXY={proxy}). The first build downloads "
            "about 800 MB of modules; check network access or set GOPROXY to a reachable mirror"
        )
    else:
        cause = "the Go build failed"
    return f"{cause}.\n$ {' '.join(argv[:3])} …\n{output}"


def _elapsed(started: float) -> str:
    seconds = int(time.monotonic() - started)
    return f"{seconds // 60}m{seconds % 60:02d}s"
