"""Locating the Go module, reading its pins, deciding whether to build, and explaining failures."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from apportion_dev.devcluster import build, paths
from apportion_dev.devcluster.paths import DevClusterError

GO_MOD = """\
// comment
module apportion.dev/controlplane

go 1.26.0

godebug default=go1.26

require go.etcd.io/etcd/server/v3 v3.7.0

require (
\tcel.dev/expr v0.25.1 // indirect
\tk8s.io/kubernetes v1.37.2 // indirect
\tsigs.k8s.io/metrics-server v0.9.0 // indirect
)

replace (
\tk8s.io/api => k8s.io/api v0.37.2
)

tool (
\tk8s.io/kubernetes/cmd/kubectl
)
"""


def test_go_mod_pins_are_read() -> None:
    versions = paths.parse_go_mod(GO_MOD)
    assert versions == paths.ModuleVersions("v1.37.2", "v3.7.0", "v0.9.0", (1, 26, 0))


def test_the_repository_module_pins_kubernetes_1_36() -> None:
    versions = paths.module_versions()
    assert versions.kubernetes.startswith("v1.37.")
    assert versions.etcd.startswith("v3.7.")


def test_go_mod_without_kubernetes_is_an_error() -> None:
    with pytest.raises(DevClusterError, match=r"k8s\.io/kubernetes"):
        paths.parse_go_mod("module x\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v3.7.0\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("go1.26.8\n", (1, 26, 8)), ("1.26", (1, 26, 0)), ("go1.27rc1", (1, 27, 0))],
)
def test_go_versions_parse(text: str, expected: tuple[int, ...]) -> None:
    assert paths.parse_go_version(text) == expected


def test_cache_and_module_locations_follow_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("APPORTION_CACHE_DIR", str(tmp_path / "cache"))
    assert paths.bin_dir() == tmp_path / "cache" / f"k8s-{paths.module_versions().kubernetes}"
    monkeypatch.setenv("APPORTION_CONTROLPLANE_MODULE", str(tmp_path))
    with pytest.raises(DevClusterError, match="APPORTION_CONTROLPLANE_MODULE"):
        paths.module_dir()
    (tmp_path / "go.mod").write_text(GO_MOD)
    assert paths.module_dir() == tmp_path


def test_version_stamps_cover_servers_and_kubectl() -> None:
    flags = build.version_ldflags("v1.37.2", "2026-07-22")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.37.2" in flags
        assert f"-X {package}.gitMajor=1" in flags
        assert f"-X {package}.gitMinor=37" in flags
        assert f"-X {package}.buildDate=2026-07-22" in flags
        assert f"-X {package}.gitTreeState=clean" in flags


def fake_build(directory: Path, stamp: dict[str, object]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in paths.BINARIES:
        (directory / name).write_text("#!/bin/sh\n")
        (directory / name).chmod(0o755)
    (directory / build.STAMP_FILE).write_text(json.dumps({**stamp, "buildDate": "x"}))


def test_a_build_is_reused_only_when_binaries_and_stamp_match(tmp_path: Path) -> None:
    module = paths.module_dir()
    stamp = build.build_stamp(paths.module_versions(module), module)
    target = tmp_path / "k8s"
    assert not build.is_built(target, stamp)
    fake_build(target, stamp)
    assert build.is_built(target, stamp)
    assert not build.is_built(target, {**stamp, "go.sum": "changed"})
    (target / "kubectl").unlink()
    assert not build.is_built(target, stamp)


def test_ensure_built_returns_the_cached_directory_without_go(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = paths.module_dir()
    monkeypatch.setenv("APPORTION_CACHE_DIR", str(tmp_path))
    fake_build(paths.bin_dir(), build.build_stamp(paths.module_versions(module), module))
    monkeypatch.setenv("PATH", "")  # no go: a cached build must not need it
    assert build.ensure_built() == paths.bin_dir()


def test_missing_go_fails_with_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(DevClusterError, match=r"`go` is not on PATH.*Go >= 1\.26"):
        build.check_go((1, 26, 0))


def test_old_go_fails_with_instructions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.write_text("#!/bin/sh\necho go1.22.4\n")
    go.chmod(go.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    with pytest.raises(DevClusterError, match=r"go1\.22\.4.*needs Go >= 1\.26"):
        build.check_go((1, 26, 0))


@pytest.mark.parametrize(
    ("output", "cause"),
    [
        (
            'go: k8s.io/api@v0.37.2: Get "https://proxy.golang.org/k8s.io/api/@v/v0.37.2.mod": '
            "dial tcp: lookup proxy.golang.org: no such host",
            "module proxy is unreachable",
        ),
        (
            "go: k8s.io/api@v0.37.2: module lookup disabled by GOPROXY=off",
            "downloading is disabled",
        ),
        ("./etcd/main.go:3:1: syntax error", "the Go build failed"),
    ],
)
def test_go_failures_are_explained(output: str, cause: str) -> None:
    message = build.explain_go_failure(["go", "build", "-v"], [output])
    assert message.startswith(cause) or cause in message.splitlines()[0]
    assert output in message
