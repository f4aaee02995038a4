"""The krew manifest of `kubectl apportion` (plugins/krew), checked by krew itself (built from
its Go module, `apportion_dev.devcluster.tools.KREW`): krew's manifest validator accepts it, the
archive `make krew` builds is the one it names (same sha256, the package's version), krew
installs the plugin from it, and the real kubectl then runs the krew-installed plugin against
the dev-cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from apportion_dev.devcluster.tools import KREW, ensure_tool

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "plugins" / "krew" / "apportion.yaml"


@pytest.fixture(scope="module")
def krew(request: pytest.FixtureRequest) -> Path:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        return ensure_tool(KREW)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("krew-dist")
    built = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "krew.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return Path(built[0]), built[1]


def validate(krew: Path, manifest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(krew / "validate-krew-manifest"), "-manifest", str(manifest), "-skip-install"],
        capture_output=True,
        text=True,
    )


def test_krew_validates_the_manifest_and_it_names_the_archive_make_krew_builds(
    krew: Path, archive: tuple[Path, str], tmp_path: Path
) -> None:
    done = validate(krew, MANIFEST)
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(MANIFEST.read_text())["spec"]
    (platform,) = spec["platforms"]
    path, digest = archive
    assert platform["sha256"] == digest, "plugins/krew changed: run `make krew`"
    assert platform["uri"].endswith("/" + path.name)
    version = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('apportion'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert spec["version"] == f"v{version}"
    # The validator is a real check: a manifest whose name is not its file's is refused.
    renamed = tmp_path / "other.yaml"
    shutil.copy(MANIFEST, renamed)
    assert validate(krew, renamed).returncode != 0


def test_kubectl_runs_the_plugin_krew_installed(
    krew: Path, archive: tuple[Path, str], dev_cluster, crds, namespace: str, tmp_path: Path
) -> None:
    root = tmp_path / "krew-root"
    path, _ = archive
    env = {
        "HOME": str(tmp_path),
        "KREW_ROOT": str(root),
        # The krew-installed plugin only: kubectl and python3 of the system, no venv on PATH.
        "PATH": os.pathsep.join([str(root / "bin"), str(dev_cluster.bin_dir), "/usr/bin", "/bin"]),
        "KUBECONFIG": str(dev_cluster.kubeconfig),
    }
    installed = subprocess.run(
        [str(krew / "krew"), "install", f"--manifest={MANIFEST}", f"--archive={path}"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (root / "store" / "apportion" / "v0.1.0" / "LICENSE").is_file()
    listed = subprocess.run(
        ["kubectl", "plugin", "list"], capture_output=True, text=True, env=env
    ).stdout
    assert str(root / "bin" / "kubectl-apportion") in listed

    def kubectl_apportion(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "apportion", "-n", namespace, *args],
            capture_output=True,
            text=True,
            env={**env, **extra},
        )

    # It talks to the cluster: the namespace has no such set, and the plugin says so.
    asked = kubectl_apportion("top", "nothing-here", APPORTION_PYTHON=sys.executable)
    assert asked.returncode == 1, asked.stderr
    assert f"no PartitionSet or ShardSet 'nothing-here' in namespace {namespace}" in asked.stderr
    # Without an interpreter that has the package, a clear word instead of a traceback.
    bare = kubectl_apportion("top", "nothing-here", APPORTION_PYTHON="/usr/bin/python3")
    assert bare.returncode != 0
    assert "pip install apportion" in bare.stderr
