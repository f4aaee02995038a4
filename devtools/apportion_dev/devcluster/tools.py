"""Go programs beside the control plane, each from a wrapper module of its own under devtools/go
(their dependency graphs do not fit in one module with Kubernetes'), built and cached like the
control plane (`build.GoBuild`): the real node's containerd (with its runc shim and `ctr`), the
tools the tests run (promtool, helm, krew, kstatus, argocd-lua, actionlint), Flux's
source-controller and kustomize-controller and Argo CD's multi-call binary (devcluster.flux and
devcluster.argocd run them against a dev-cluster), and CNCF Distribution's registry
(devcluster.registry)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from apportion_dev.devcluster.build import GoBuild, Progress, ensure, version_ldflags
from apportion_dev.devcluster.paths import DevClusterError, cache_root, module_dir, parse_go_version


@dataclass(frozen=True)
class GoTool:
    name: str
    module: str  # the wrapper module's directory, relative to devtools/go
    module_path: str  # the upstream module whose version go.mod pins
    binaries: tuple[str, ...]
    version_variable: str | None  # the package variable `-X` stamps with the version, if any
    main_package: str | None = None
    """A main package of the wrapper module itself (kstatus), built instead of its `tool` lines;
    its Go files count in the stamp, so an edit rebuilds it."""
    stamps: Callable[[str, str], list[str]] | None = None
    """`-X` flags from (version, build date), where one variable does not say the version."""


CONTAINERD = GoTool(
    "containerd",
    "realnode/containerd",
    "github.com/containerd/containerd/v2",
    ("containerd", "containerd-shim-runc-v2", "ctr"),
    "github.com/containerd/containerd/v2/version.Version",
)
PROMTOOL = GoTool(
    "promtool",
    "tools",
    "github.com/prometheus/prometheus",
    ("promtool",),
    "github.com/prometheus/common/version.Version",
)
HELM = GoTool(
    "helm",
    "tools/helm",
    "helm.sh/helm/v3",
    ("helm",),
    # `helm version` reads it; unstamped, helm reports its module's placeholder version
    "helm.sh/helm/v3/internal/version.version",
)
KREW = GoTool(
    "krew",
    "tools/krew",
    "sigs.k8s.io/krew",
    ("krew", "validate-krew-manifest"),
    "sigs.k8s.io/krew/internal/version.gitTag",
)
KSTATUS = GoTool(
    "kstatus",
    "kstatus",
    "sigs.k8s.io/cli-utils",
    ("kstatus",),
    "main.version",
    main_package="apportion.dev/kstatus",
)
"""sigs.k8s.io/cli-utils' kstatus as a command: how GitOps tools judge a status."""
ARGOCD_LUA = GoTool(
    "argocd-lua",
    "argocd",
    "github.com/argoproj/argo-cd/v3",
    ("argocd-lua",),
    "main.version",
    main_package="apportion.dev/argocd/argocd-lua",
)
"""Argo CD's health checks as a command: argocd-cm read by Argo CD's settings manager, the scripts
run by its Lua VM (tests/unit/test_argocd_health.py). From the same wrapper module as ARGOCD, so
both are one Argo CD release."""
ARGOCD = GoTool(
    "argocd",
    "argocd",
    "github.com/argoproj/argo-cd/v3",
    ("argocd",),
    None,
    stamps=lambda version, build_date: [
        # what Argo CD's Makefile stamps; its VERSION file has no "v"
        f"-X github.com/argoproj/argo-cd/v3/common.version={version.removeprefix('v')}",
        f"-X github.com/argoproj/argo-cd/v3/common.buildDate={build_date}",
    ],
)
"""Argo CD's multi-call binary (`cmd/`): the component it runs is named by argv[0] or
$ARGOCD_BINARY_NAME (devcluster.argocd runs its repo-server and application-controller)."""
KUSTOMIZE = GoTool(
    "kustomize",
    "tools/kustomize",
    "sigs.k8s.io/kustomize/kustomize/v5",
    ("kustomize",),
    # `kustomize version` reads its module's version from the build info
    None,
)
"""What Argo CD's repo-server runs for a kustomization.yaml, at the version its images ship."""
ARGOCD_TOOLS = (ARGOCD, KUSTOMIZE, HELM)
"""Argo CD and what its repo-server runs (devcluster.argocd)."""
ACTIONLINT = GoTool(
    "actionlint",
    "tools/actionlint",
    "github.com/rhysd/actionlint",
    ("actionlint",),
    "github.com/rhysd/actionlint.version",
)
"""The release workflow's checker (tests/unit/test_release_workflow.py)."""
# Flux v1.9.x: v1.10 needs Go 1.27. One wrapper module per controller (one shared module would
# move each controller's dependencies off its release's versions); neither has a version variable.
FLUX_SOURCE_CONTROLLER = GoTool(
    "flux-source-controller",
    "flux/source-controller",
    "github.com/fluxcd/source-controller",
    ("source-controller",),
    None,
)
FLUX_KUSTOMIZE_CONTROLLER = GoTool(
    "flux-kustomize-controller",
    "flux/kustomize-controller",
    "github.com/fluxcd/kustomize-controller",
    ("kustomize-controller",),
    None,
)
FLUX_TOOLS = (FLUX_SOURCE_CONTROLLER, FLUX_KUSTOMIZE_CONTROLLER)
REGISTRY = GoTool(
    "registry",
    "tools/registry",
    "github.com/distribution/distribution/v3",
    ("registry",),
    "github.com/distribution/distribution/v3/version.version",
)
"""CNCF Distribution, the reference OCI registry: what `dev-cluster start --registry` serves the
release's images and chart from (devcluster.registry)."""
OLDEST_KUBERNETES = GoTool(
    "kubernetes-oldest",
    "controlplane-oldest",
    "k8s.io/kubernetes",
    ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl"),
    None,
    stamps=version_ldflags,
)
"""The oldest Kubernetes we support, for a dev-cluster with the pod simulator
(`DevCluster.start(binaries=...)`): the CRDs, the policies and a convergence test run on it."""
TEST_TOOLS = (
    PROMTOOL,
    HELM,
    KREW,
    KSTATUS,
    ARGOCD_LUA,
    ARGOCD,
    KUSTOMIZE,
    ACTIONLINT,
    *FLUX_TOOLS,
    REGISTRY,
    OLDEST_KUBERNETES,
)
"""What `make tools` builds: the tools the tests run against what we ship."""
ALL_TOOLS = {tool.name: tool for tool in (*TEST_TOOLS, CONTAINERD)}
"""Every wrapper-module build by name: `apportion dev-cluster tools NAME...` builds any of them."""

_TOOL_BLOCK = re.compile(r"^tool\s*\(\s*\n(.*?)^\)", re.MULTILINE | re.DOTALL)
_TOOL_LINE = re.compile(r"^tool\s+(\S+)\s*$", re.MULTILINE)
_GO_LINE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)


def tool_module_dir(tool: GoTool) -> Path:
    return module_dir().parent / tool.module


def tool_build(tool: GoTool) -> GoBuild:
    module = tool_module_dir(tool)
    text = (module / "go.mod").read_text()
    pinned = re.search(rf"^\s*(?:require\s+)?{re.escape(tool.module_path)}\s+(v\S+)", text, re.M)
    go = _GO_LINE.search(text)
    block = _TOOL_BLOCK.search(text)
    targets = tuple(block.group(1).split()) if block else tuple(_TOOL_LINE.findall(text))
    sources: dict[str, str] = {}
    if tool.main_package is not None:
        targets = (tool.main_package,)
        sources = {
            str(path.relative_to(module)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(module.rglob("*.go"))
        }
    if pinned is None or go is None or not targets:
        raise DevClusterError(f"{module / 'go.mod'} does not pin {tool.module_path} and its tools")
    version = pinned.group(1)
    return GoBuild(
        what=f"{tool.name} {version}",
        module=module,
        targets=targets,
        binaries=tool.binaries,
        directory=cache_root() / f"{tool.name}-{version}",
        stamp={
            tool.name: version,
            "targets": list(targets),
            "go.sum": hashlib.sha256((module / "go.sum").read_bytes()).hexdigest(),
            **({"sources": sources} if sources else {}),
        },
        go_minimum=parse_go_version(go.group(1)),
        dated_module=tool.module_path,
        ldflags=lambda date: _stamps(tool, version, date),
    )


def _stamps(tool: GoTool, version: str, build_date: str) -> list[str]:
    if tool.stamps is not None:
        return tool.stamps(version, build_date)
    return [f"-X {tool.version_variable}={version}"] if tool.version_variable else []


def ensure_tool(tool: GoTool, progress: Progress | None = None) -> Path:
    """The directory holding the tool's binaries, built first if missing or stale."""
    return ensure(tool_build(tool), progress)
