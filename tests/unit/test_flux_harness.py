"""The Flux harness's static parts (which controllers `make tools` builds, which CRDs it installs)
and the loopback Git server, which a plain `git clone` must read over smart HTTP."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from apportion_dev.devcluster import flux
from apportion_dev.devcluster.tools import FLUX_TOOLS, TEST_TOOLS, tool_build
from apportion_dev.gitserver import GitServer


def test_make_tools_builds_both_flux_controllers_at_one_version_without_a_stamp() -> None:
    assert set(FLUX_TOOLS) <= set(TEST_TOOLS)
    builds = [tool_build(tool) for tool in FLUX_TOOLS]
    assert [b.targets for b in builds] == [
        ("github.com/fluxcd/source-controller",),
        ("github.com/fluxcd/kustomize-controller",),
    ]
    versions = {b.stamp[tool.name] for b, tool in zip(builds, FLUX_TOOLS, strict=True)}
    assert versions == {"v1.9.6"}
    for build in builds:
        assert build.ldflags("2026-01-01T00:00:00Z") == []
        go_mod = (build.module / "go.mod").read_text()
        # the api module at the controller's version: upstream replaces it with ./api
        assert f"{build.targets[0]}/api v1.9.6" in go_mod
        assert "github.com/opencontainers/go-digest =>" in go_mod


def test_the_crds_installed_are_the_ones_the_controllers_need() -> None:
    names = set()
    for path in flux.CRD_DIR.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        names.add(crd["metadata"]["name"])
    assert names == set(flux.CRDS)


def test_the_git_server_serves_commits_over_smart_http(tmp_path: Path) -> None:
    with GitServer(tmp_path / "git") as server:
        repo = server.create("app")
        repo.write("deploy/a.yaml", "a: 1\n")
        sha = repo.commit("first")
        clone = tmp_path / "clone"
        result = subprocess.run(
            ["git", "clone", "--quiet", server.url("app"), str(clone)],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)},
            check=False,
        )
        assert result.returncode == 0, result.stderr
        head = subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        assert head.stdout.strip() == sha
        assert (clone / "deploy" / "a.yaml").read_text() == "a: 1\n"
        assert server.requests >= 2  # info/refs, then upload-pack: smart, not dumb, HTTP
