"""End-to-end fixtures: one real control plane (etcd, kube-apiserver, kube-controller-manager and
the pod simulator, see docs/dev-cluster.md) shared by the whole test session.

Fixtures
  dev_cluster  (session) a running `apportion_dev.devcluster.DevCluster`. The control-plane binaries
               are built first when they are not cached (build progress is shown even under
               capture); a failed build or start is an error, never a skip.
               Useful members: .kubectl(*args, input=None, check=True) → CompletedProcess[str]
               (raises KubectlError with kubectl's stderr), .kubeconfig, .server, .token,
               .env (KUBECONFIG + our kubectl first on PATH, for subprocesses such as the
               operator), .pod_log_path(namespace, name) (output of process-simulated pods),
               .log_path("kube-apiserver" | "kube-controller-manager" | "etcd" | "podsim").
  real_cluster (session) a DevCluster with a real node (kubelet, containerd, runc, kube-proxy,
               kube-scheduler, metrics-server; see apportion_dev.devcluster.realnode) instead of the
               pod simulator, its images built first, and an OCI registry (.registry) its
               containerd pulls the published names `ghcr.io/apportion/...` from. One per
               machine: the real-node tests share it, and tests/e2e/test_real_node_cleanup.py
               and tests/e2e/test_real_nodes.py (whose module fixture starts four real nodes)
               run before anything starts it.
  kubectl      dev_cluster.kubectl.
  namespace    (per test) the name of a fresh namespace whose default ServiceAccount exists, so
               bare Pods can be created at once, and the workers' ServiceAccount
               (tests.support.unitset.grant_worker_role); deleted after the test without waiting.
  wait_for     wait_for(condition, timeout=60.0, message="...") polls `condition()` every 0.2 s
               and returns its first truthy value, or fails the test with `message`.
  crds         (session) apportion's CRDs applied from crds/, Established and serving.
  helm         (session) helm(*args, check=True) runs the helm built from its Go module
               (tests/conftest.py helm_binary) with a private HOME, config, cache and data.
  git_server   (module) a loopback smart-HTTP Git server in the test process
               (apportion_dev.gitserver) for the GitOps tests of Flux and Argo CD.
  operator     (per test) `apportion operator` watching `namespace`, as a process (see
               tests.support.unitset.Operator) under the operator's own ServiceAccount token
               (`operator_identity`: its role and the operator policy, as installed); the
               test fails if it crashed or did not stop
               cleanly. In a module marked `shares_operator` (its tests never stop, restart or
               reconfigure the operator, nor read its log or metrics), one operator per session
               serves every such test's namespace (`shared-*`); a test fails if that operator
               exited or logged a traceback while it ran.

Every test under tests/e2e is marked `e2e`, or `realnode` when it runs on the real node (tests/
conftest.py; select or deselect with `-m e2e`, `-m "not realnode"`).
Pods run on simulated nodes sim-node-0..2 (zones zone-a..c) with loopback IPs; annotate a pod
`apportion.dev/simulate: process` to run its first container's command as a local process, as
its ServiceAccount (a bound token, like the kubelet's; see apportion_dev.devcluster.podsim).
APPORTION_KEEP_STATE=1 keeps the cluster's state directory (logs, pod logs) after the session.
"""

from __future__ import annotations

import re
import secrets
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.net import http_get
from apportion_dev.gitserver import GitServer
from tests.support.tokens import token_kubeconfig
from tests.support.unitset import Operator, grant_worker_role
from tests.support.waiting import wait_for

HERE = Path(__file__).parent
REPO = HERE.parents[1]
# The namespaces of `shares_operator` modules' tests, which the shared operator serves.
SHARED_PREFIX = "shared-"
OPERATOR_NAMESPACE = "apportion-system"  # where every install path puts the operator


@pytest.fixture(scope="session")
def dev_cluster(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    # A first build takes minutes: let its progress reach the terminal.
    with capture.global_and_fixture_disabled():
        cluster = DevCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def real_cluster(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        cluster = DevCluster.start(real_node=True, registry=True)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kubectl(dev_cluster: DevCluster) -> Callable[..., Any]:
    return dev_cluster.kubectl


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    return wait_for


def shares_operator(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("shares_operator") is not None


@pytest.fixture
def namespace(dev_cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    prefix = SHARED_PREFIX if shares_operator(request) else ""
    name = f"{prefix}{slug}-{secrets.token_hex(3)}"
    dev_cluster.kubectl("create", "namespace", name)
    account = f"{dev_cluster.server}/api/v1/namespaces/{name}/serviceaccounts/default"
    wait_for(
        lambda: http_get(account, token=dev_cluster.token, ca_file=dev_cluster.ca_file)[0] == 200,
        timeout=30,
        message=f"no default ServiceAccount in namespace {name}",
    )
    grant_worker_role(dev_cluster.kubectl, name)
    yield name
    dev_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def crds(dev_cluster: DevCluster) -> None:
    install_crds(dev_cluster)


def install_crds(dev_cluster: DevCluster) -> None:
    """apportion's CRDs installed as a user would (`kubectl apply -f crds/`), established and
    serving lists (Established comes a moment before the storage answers)."""
    dev_cluster.kubectl("apply", "-f", str(REPO / "crds"))
    dev_cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/graintypes.apportion.dev",
        "crd/partitionsets.apportion.dev",
        "crd/shardsets.apportion.dev",
    )
    wait_for(
        lambda: dev_cluster.kubectl("get", "apportion", "-A", check=False).returncode == 0,
        timeout=30,
        message="the apportion CRDs never served lists",
    )


_IDENTITIES: dict[Path, Path] = {}


def operator_identity(dev_cluster: DevCluster, directory: Path) -> Path:
    """A kubeconfig with nothing but a token of the operator's ServiceAccount, with the rights
    every install path gives it: manifests/rbac.yaml in apportion-system, and the operator
    policy; made once per cluster (a module may start a cluster of its own). The `operator`
    fixture runs under it, so the e2e suite fails on anything the operator needs that its role
    or the policy refuses."""
    made = _IDENTITIES.get(dev_cluster.kubeconfig)
    if made is not None:
        return made
    manifests = REPO / "manifests"
    dev_cluster.kubectl("apply", "-f", str(manifests / "namespace.yaml"))
    dev_cluster.kubectl("apply", "-n", OPERATOR_NAMESPACE, "-f", str(manifests / "rbac.yaml"))
    dev_cluster.kubectl("apply", "-f", str(manifests / "operator-policy.yaml"))
    token = dev_cluster.kubectl(
        "create", "token", "apportion-operator", "-n", OPERATOR_NAMESPACE, "--duration=12h"
    ).stdout.strip()
    directory.mkdir(parents=True, exist_ok=True)
    made = token_kubeconfig(
        dev_cluster, directory / "operator.kubeconfig", token, OPERATOR_NAMESPACE
    )
    _IDENTITIES[dev_cluster.kubeconfig] = made
    return made


@pytest.fixture(scope="session")
def shared_operator(
    dev_cluster: DevCluster, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Operator]:
    """One operator for every test of the modules marked `shares_operator`: it serves the
    namespaces their `namespace` fixture names (a kopf glob), so those tests do not each pay
    for an operator's start and stop."""
    directory = tmp_path_factory.mktemp("shared-operator")
    identity = operator_identity(dev_cluster, directory)
    process = Operator(dev_cluster, f"{SHARED_PREFIX}*", directory / "log", kubeconfig=identity)
    yield process
    assert process.stop() == 0, process.text()


@pytest.fixture
def operator(
    dev_cluster: DevCluster,
    crds: None,
    namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[Operator]:
    """The test's operator: its own process, or in a `shares_operator` module the shared one,
    judged on what it logged during this test."""
    if shares_operator(request):
        shared: Operator = request.getfixturevalue("shared_operator")
        start = len(shared.text())
        yield shared
        during = shared.text()[start:]
        assert shared.process.poll() is None, f"the shared operator exited: {during}"
        assert "Traceback" not in during, during
        return
    identity = operator_identity(dev_cluster, tmp_path)
    process = Operator(dev_cluster, namespace, tmp_path / "operator.log", kubeconfig=identity)
    yield process
    assert process.stop() == 0, process.text()
    assert "Traceback" not in process.text(), process.text()


@pytest.fixture(scope="session")
def helm(
    helm_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., subprocess.CompletedProcess]:
    """Run helm with its config, cache and data in a private directory."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }

    def run(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(helm_binary), *args], capture_output=True, text=True, env=env, timeout=timeout
        )
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GitServer]:
    with GitServer(tmp_path_factory.mktemp("git")) as server:
        yield server
