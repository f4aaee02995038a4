"""The real node's static parts: which Go programs it builds, and that the image names the
manifests, the overlay and the image builder use agree."""

from __future__ import annotations

from pathlib import Path

import yaml

from apportion_dev.devcluster.realnode import images
from apportion_dev.devcluster.tools import (
    CONTAINERD,
    KSTATUS,
    OLDEST_KUBERNETES,
    PROMTOOL,
    tool_build,
)

REPO = Path(__file__).resolve().parents[2]


def test_node_tools_build_the_pinned_versions_of_their_commands() -> None:
    containerd = tool_build(CONTAINERD)
    assert containerd.targets == tuple(
        f"github.com/containerd/containerd/v2/cmd/{name}"
        for name in ("containerd", "containerd-shim-runc-v2", "ctr")
    )
    go_mod = (containerd.module / "go.mod").read_text()
    assert f"github.com/containerd/containerd/v2 {containerd.stamp['containerd']}" in go_mod
    assert containerd.directory.name == f"containerd-{containerd.stamp['containerd']}"


def test_the_node_names_its_image_as_the_manifests_and_samples_do() -> None:
    """manifests/ and its samples run on the real node unchanged: every image they name is one
    of the names the node gives the image built here."""
    operator, demo = images.published_names()
    base = yaml.safe_load((REPO / "manifests" / "kustomization.yaml").read_text())
    (image,) = base["images"]
    assert f"{image['newName']}:{image['newTag']}" == operator
    named = set()
    for path in sorted((REPO / "manifests" / "samples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
            named |= {container["image"] for container in spec.get("containers", [])}
    assert named == {demo}


def test_promtool_is_built_from_the_tools_module() -> None:
    promtool = tool_build(PROMTOOL)
    assert promtool.targets == ("github.com/prometheus/prometheus/cmd/promtool",)
    assert promtool.directory.name == f"promtool-{promtool.stamp['promtool']}"


def test_kstatus_is_built_from_its_own_module_and_rebuilt_when_its_source_changes() -> None:
    kstatus = tool_build(KSTATUS)
    assert kstatus.targets == ("apportion.dev/kstatus",)
    assert kstatus.stamp["kstatus"] == "v0.37.2"
    assert kstatus.directory.name == "kstatus-v0.37.2"
    assert set(kstatus.stamp["sources"]) == {"main.go"}  # type: ignore[call-overload]


def test_the_oldest_kubernetes_builds_its_control_plane_stamped_with_its_version() -> None:
    oldest = tool_build(OLDEST_KUBERNETES)
    assert set(oldest.targets) == {
        "apportion.dev/controlplane-oldest/etcd",
        *(f"k8s.io/kubernetes/cmd/{name}" for name in oldest.binaries if name != "etcd"),
    }
    version = oldest.stamp["kubernetes-oldest"]
    assert str(version).startswith("v1.30.")
    assert oldest.directory.name == f"kubernetes-oldest-{version}"
    flags = oldest.ldflags("2026-01-01")
    assert f"-X k8s.io/component-base/version.gitVersion={version}" in flags
    assert "-X k8s.io/component-base/version.gitMinor=30" in flags
