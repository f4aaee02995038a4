"""Worker applications kept outside the package tree (tests/e2e/apps: their own pyproject.toml
and pom.xml) install apportion's libraries the way a user's build does, from a package index and
a Maven repository serving a release, and serve their units as the pods of one PartitionSet: a
Python worker and a Java worker side by side, placed by the operator, handing units over when
the Java one drains. `kubectl apportion`, installed by krew from the release's manifest and
archive, reads the set with the library pip installed.

The release is `scripts/release.py --only python --only java --only chart` of this checkout
stamped with a version nothing else has (`tests.support.release.stamped`), served by the
dev-cluster's `distserver`: whatever of that version pip or Maven installs can only have come
from it, and the test checks so (pip's installation report, Maven's `_remote.repositories`)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import venv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.distserver import INDEX, MAVEN
from apportion_dev.devcluster.net import free_port, http_get
from apportion_dev.devcluster.podsim import pod_log_path
from apportion_dev.devcluster.tools import KREW, ensure_tool
from tests.support import release
from tests.support.java import local_repository
from tests.support.unitset import apply, read_table, unit_set, workers
from tests.support.waiting import wait_for

APPS = Path(__file__).resolve().parent / "apps"
VERSION = f"0.0.{secrets.randbelow(900_000) + 100_000}"
SET = "orders"
PARTITIONS = 8
PYTHON_POD, JAVA_POD = f"{SET}-0", f"{SET}-1"


@dataclass(frozen=True)
class Served:
    dist: Path
    index: str
    maven: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The release's Python distributions and Maven repository, served as the dev-cluster
    serves a `--dist` directory."""
    work = tmp_path_factory.mktemp("release")
    dist = release.stamped(work, VERSION, ["python", "java", "chart"])
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apportion_dev.devcluster.distserver",
            f"--dist={dist}",
            f"--port={port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http_get(f"{url}{INDEX}")[0] == 200, timeout=30, message="no index")
        yield Served(dist, f"{url}{INDEX}", f"{url}{MAVEN}")
    finally:
        server.terminate()
        server.wait(10)


def python_app(served: Served, work: Path) -> Path:
    """The Python app installed into a fresh virtualenv from the index (its dependencies from
    PyPI, as a mirror would proxy them); its interpreter."""
    source = shutil.copytree(APPS / "python-worker", work / "python-worker")
    env = work / "venv"
    venv.create(env, with_pip=True)
    report = work / "report.json"
    result = subprocess.run(
        [
            str(env / "bin" / "python"), "-m", "pip", "install", "--quiet",
            "--index-url", served.index,
            "--extra-index-url", "https://pypi.org/simple",
            "--report", str(report),
            f"apportion=={VERSION}", str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    installed = {
        item["metadata"]["name"]: item["download_info"]["url"]
        for item in json.loads(report.read_text())["install"]
    }
    assert installed["apportion"].startswith(served.index.rsplit("/simple/", 1)[0])
    assert installed["apportion"].endswith(".whl")
    return env / "bin" / "python"


def java_app(served: Served, work: Path) -> str:
    """The Java app built by Maven against the client from the repository, its dependencies
    copied beside it (target/dependency); its classpath."""
    source = shutil.copytree(APPS / "java-worker", work / "java-worker")
    local = local_repository()
    result = subprocess.run(
        [
            "mvn", "-B", "-q",
            f"-Dmaven.repo.local={local}",
            f"-Dapportion.version={VERSION}",
            f"-Dapportion.repository={served.maven}",
            "package", "dependency:copy-dependencies",
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
    client = local / "dev" / "apportion" / "apportion-client" / VERSION
    try:
        # Maven notes which repository each artifact came from: ours, by its id in the pom.
        assert (
            f"apportion-client-{VERSION}.jar>apportion="
            in (client / "_remote.repositories").read_text()
        )
    finally:
        for installed in local.glob(f"dev/apportion/*/{VERSION}"):
            shutil.rmtree(installed)  # a version no other build may pick up
    # The app as it ships: its classes and its dependencies' jars beside them, none from the
    # local repository (whose copy of this version is gone).
    return f"{source / 'target' / 'classes'}:{source / 'target' / 'dependency'}/*"


def kubectl_apportion(
    cluster: DevCluster, served: Served, python: Path, work: Path
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`kubectl apportion` as krew installs it from the release's manifest and archive, run by
    the real kubectl with the interpreter pip installed the library into."""
    root = work / "krew-root"
    env = {
        "HOME": str(work),
        "KREW_ROOT": str(root),
        "PATH": os.pathsep.join([str(root / "bin"), str(cluster.bin_dir), "/usr/bin", "/bin"]),
        "KUBECONFIG": str(cluster.kubeconfig),
        "APPORTION_PYTHON": str(python),
    }
    (archive,) = (served.dist / "krew").glob("*.tar.gz")
    installed = subprocess.run(
        [
            str(ensure_tool(KREW) / "krew"),
            "install",
            f"--manifest={served.dist / 'krew' / 'apportion.yaml'}",
            f"--archive={archive}",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert (root / "store" / "apportion" / f"v{VERSION}").is_dir()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "apportion", *args], capture_output=True, text=True, env=env, check=False
        )

    return run


def callbacks(cluster: DevCluster, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The app's callback lines (its log holds the library's log lines too)."""
    log = pod_log_path(cluster.state_dir, namespace, pod)
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith('{"event"')]


def log_tail(cluster: DevCluster, namespace: str, pod: str) -> str:
    log = pod_log_path(cluster.state_dir, namespace, pod)
    return "\n".join(log.read_text().splitlines()[-30:]) if log.exists() else "(no log)"


def serves(cluster: DevCluster, namespace: str, pod: str) -> set[str]:
    held: set[str] = set()
    for line in callbacks(cluster, namespace, pod):
        if line["event"] == "acquire":
            held |= set(line["units"])
        else:
            held -= set(line["units"])
    return held


def owned(kubectl: Callable[..., Any], namespace: str) -> dict[str, set[str]]:
    table = read_table(kubectl, namespace, "PartitionSet", SET)
    if table is None:
        return {}
    by_pod: dict[str, set[str]] = {}
    for unit, state in table.units.items():
        if state.owner is not None and state.releasing is None:
            by_pod.setdefault(state.owner, set()).add(unit)
    return by_pod


def test_python_and_java_apps_from_the_release_serve_their_partitions(
    dev_cluster: DevCluster,
    namespace: str,
    operator: Any,
    served: Served,
    tmp_path: Path,
) -> None:
    python = python_app(served, tmp_path)
    classpath = java_app(served, tmp_path)
    apps = (
        f'case "$POD_NAME" in *-0) exec {python} -m orders_worker PartitionSet {SET};; '
        f"*) exec java -cp '{classpath}' example.OrdersWorker PartitionSet {SET};; esac"
    )
    kubectl = dev_cluster.kubectl
    apply(kubectl, namespace, workers(SET, 2, command=["sh", "-c", apps], grace=30))
    spec = {
        "partitions": PARTITIONS,
        "workloadRef": {"kind": "StatefulSet", "name": SET},
        "rebalance": {"handoffTimeout": "20s", "interval": "1s"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", SET, spec))

    def each_serves_what_the_table_gives_it() -> bool:
        table = owned(kubectl, namespace)
        return (
            set(table) == {PYTHON_POD, JAVA_POD}
            and sum(map(len, table.values())) == PARTITIONS
            and all(serves(dev_cluster, namespace, pod) == table[pod] for pod in table)
        )

    wait_for(
        each_serves_what_the_table_gives_it,
        timeout=180,
        message=lambda: (
            f"table {owned(kubectl, namespace)}; the Python app serves "
            f"{serves(dev_cluster, namespace, PYTHON_POD)}, the Java app "
            f"{serves(dev_cluster, namespace, JAVA_POD)}; its log ends:\n"
            f"{log_tail(dev_cluster, namespace, JAVA_POD)}"
        ),
    )

    plugin = kubectl_apportion(dev_cluster, served, python, tmp_path)
    top = plugin("-n", namespace, "top", SET)
    assert top.returncode == 0, top.stderr
    rows = {line.split()[0]: line.split()[1] for line in top.stdout.splitlines()[1:]}
    assert rows == {pod: str(len(units)) for pod, units in owned(kubectl, namespace).items()}

    # The Java app drains: its units reach the Python app through the hand-off, released first.
    java_units = owned(kubectl, namespace)[JAVA_POD]
    kubectl("scale", "statefulset", SET, "-n", namespace, "--replicas=1")
    wait_for(
        lambda: (
            owned(kubectl, namespace) == {PYTHON_POD: {str(u) for u in range(PARTITIONS)}}
            and serves(dev_cluster, namespace, PYTHON_POD) == {str(u) for u in range(PARTITIONS)}
        ),
        timeout=180,
        message=lambda: (
            f"table {owned(kubectl, namespace)}; the Python app serves "
            f"{serves(dev_cluster, namespace, PYTHON_POD)}"
        ),
    )
    released = {
        unit
        for line in callbacks(dev_cluster, namespace, JAVA_POD)
        if line["event"] == "release"
        for unit in line["units"]
    }
    assert released == java_units
    assert not [e for e in callbacks(dev_cluster, namespace, JAVA_POD) if e["event"] == "revoke"]
