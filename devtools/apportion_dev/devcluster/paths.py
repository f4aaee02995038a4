"""Where the control-plane Go module and the cached binaries live, and which versions they are.

The Go module's go.mod is the single source of truth for versions: bumping Kubernetes there moves
the cache to a new directory, so two versions never overwrite each other.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")
# The real node's Kubernetes half and its metrics-server, built in the same `go build` from the
# same module so that their Kubernetes libraries always match the control plane's.
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy", "metrics-server")
BINARIES = CONTROL_PLANE_BINARIES + NODE_BINARIES


class DevClusterError(RuntimeError):
    """A dev-cluster step failed; the message says what to do about it."""


@dataclass(frozen=True)
class ModuleVersions:
    kubernetes: str  # "v1.37.2"
    etcd: str  # "v3.7.0"
    metrics_server: str  # "v0.9.0"
    go: tuple[int, ...]  # minimum Go from the `go` line, e.g. (1, 26, 0)


_PINNED = ("k8s.io/kubernetes", "go.etcd.io/etcd/server/v3", "sigs.k8s.io/metrics-server")
_REQUIRE = re.compile(r"^[ \t]*(?:require[ \t]+)?(\S+)[ \t]+(v\S+)", re.MULTILINE)
_GO_LINE = re.compile(r"^go[ \t]+(\d+(?:\.\d+)*)[ \t]*$", re.MULTILINE)


def parse_go_mod(text: str) -> ModuleVersions:
    """Read the pinned Kubernetes, etcd and metrics-server versions and the minimum Go from a
    go.mod's text."""
    required: dict[str, str] = {}
    for path, version in _REQUIRE.findall(text):
        # `replace` lines look like `k8s.io/api => k8s.io/api v0.37.2`; `=>` is never a module.
        required.setdefault(path, version)
    go = _GO_LINE.search(text)
    missing = [m for m in _PINNED if m not in required]
    if missing or go is None:
        raise DevClusterError(f"go.mod does not pin {', '.join(missing) or 'a go version'}")
    return ModuleVersions(
        kubernetes=required["k8s.io/kubernetes"],
        etcd=required["go.etcd.io/etcd/server/v3"],
        metrics_server=required["sigs.k8s.io/metrics-server"],
        go=parse_go_version(go.group(1)),
    )


def parse_go_version(text: str) -> tuple[int, ...]:
    """`go1.26.8` / `1.26` / `go1.27rc1` → (1, 26, 8) / (1, 26, 0) / (1, 27, 0)."""
    match = re.match(r"(?:go)?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise DevClusterError(f"cannot read a Go version from {text!r}")
    return tuple(int(part or 0) for part in match.groups())


def module_dir() -> Path:
    """The Go wrapper module: $APPORTION_CONTROLPLANE_MODULE, else devtools/go/controlplane beside
    the package in a source checkout."""
    override = os.environ.get("APPORTION_CONTROLPLANE_MODULE")
    path = (
        Path(override) if override else Path(__file__).resolve().parents[2] / "go" / "controlplane"
    )
    if not (path / "go.mod").is_file():
        raise DevClusterError(
            f"the control-plane Go module is not at {path}; run from a source checkout of "
            "apportion or set APPORTION_CONTROLPLANE_MODULE to its directory"
        )
    return path


def module_versions(module: Path | None = None) -> ModuleVersions:
    return parse_go_mod(((module or module_dir()) / "go.mod").read_text())


def cache_root() -> Path:
    """$APPORTION_CACHE_DIR, else $XDG_CACHE_HOME/apportion, else ~/.cache/apportion."""
    override = os.environ.get("APPORTION_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "apportion"


def bin_dir(versions: ModuleVersions | None = None) -> Path:
    return cache_root() / f"k8s-{(versions or module_versions()).kubernetes}"
