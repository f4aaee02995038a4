"""On the real node: pods are real containers from the image built here, started by a kubelet,
reaching the API server through the `kubernetes` Service with verified TLS as their own
ServiceAccount; the operator is installed from its manifests as a user would, and the demo
workers follow its placement as containers, with SIGTERM and grace periods from the kubelet.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import subprocess
import textwrap
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from apportion_dev.devcluster import DevCluster, KubectlError
from apportion_dev.devcluster.realnode.host import CLUSTER_CIDR, GATEWAY
from apportion_dev.devcluster.realnode.images import published_names
from apportion_dev.devcluster.realnode.node import NODE_NAME
from tests.support.postgres import PostgresServer
from tests.support.unitset import Ownership, overlap_spans, overlaps, ownership_lines, read_table

OPERATOR_IMAGE, DEMO_IMAGE = published_names()  # the built image, as the node names it

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "apportion-system"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

# Run inside a container: a SelfSubjectReview through the `kubernetes` Service, with the pod's
# projected token and the cluster CA (TLS verified), printing the review's status.
WHO_AM_I = textwrap.dedent(
    """
    import json, os, ssl, urllib.request
    account = "/var/run/secrets/kubernetes.io/serviceaccount"
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    request = urllib.request.Request(
        f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        data=json.dumps({"apiVersion": "authentication.k8s.io/v1",
                         "kind": "SelfSubjectReview"}).encode(),
        headers={"Authorization": "Bearer " + open(account + "/token").read(),
                 "Content-Type": "application/json"},
        method="POST",
    )
    context = ssl.create_default_context(cafile=account + "/ca.crt")
    print(json.dumps(json.load(urllib.request.urlopen(request, context=context))["status"]))
    """
)

# Run inside a worker container: patch another pod's ack annotation with the kubelet's token, as
# a faulty worker would; prints the HTTP status and the API server's message.
FORGE_ACK = textwrap.dedent(
    """
    import json, os, ssl, sys, urllib.error, urllib.request
    account = "/var/run/secrets/kubernetes.io/serviceaccount"
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    namespace, victim = os.environ["POD_NAMESPACE"], sys.argv[1]
    request = urllib.request.Request(
        f"https://{host}:{port}/api/v1/namespaces/{namespace}/pods/{victim}",
        data=json.dumps({"metadata": {"annotations": {"apportion.dev/ack.x.y": "{}"}}}).encode(),
        headers={"Authorization": "Bearer " + open(account + "/token").read(),
                 "Content-Type": "application/merge-patch+json"},
        method="PATCH",
    )
    context = ssl.create_default_context(cafile=account + "/ca.crt")
    try:
        print(json.dumps([urllib.request.urlopen(request, context=context).status, ""]))
    except urllib.error.HTTPError as error:
        print(json.dumps([error.code, json.load(error)["message"]]))
    """
)


@pytest.fixture
def real_namespace(real_cluster: DevCluster) -> Iterator[str]:
    """A namespace that enforces the `restricted` Pod Security Standard."""
    name = f"real-{secrets.token_hex(3)}"
    real_cluster.kubectl("create", "namespace", name)
    real_cluster.kubectl(
        "label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted"
    )
    yield name
    real_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def who_am_i(cluster: DevCluster, namespace: str, pod: str) -> dict[str, Any]:
    result = cluster.kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", WHO_AM_I)
    return json.loads(result.stdout)


def test_the_node_is_a_real_kubelet_with_its_own_identity(real_cluster: DevCluster) -> None:
    node = json.loads(real_cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    # The kubelet is confined by the Node authorizer: it may read its own Node, not change
    # another's; the admin token is not what it uses.
    kubelet_kubeconfig = yaml.safe_load(
        (real_cluster.state_dir / "node" / "kubeconfigs" / "kubelet.yaml").read_text()
    )
    assert "token" not in kubelet_kubeconfig["users"][0]["user"]
    as_node = real_cluster.kubectl(
        "auth",
        "can-i",
        "delete",
        "nodes",
        f"--as=system:node:{NODE_NAME}",
        "--as-group=system:nodes",
        check=False,
    )
    assert as_node.stdout.strip() == "no"


def test_a_pod_reaches_the_api_server_as_its_service_account(
    real_cluster: DevCluster, real_namespace: str, wait_for: Callable[..., Any]
) -> None:
    kubectl = real_cluster.kubectl
    kubectl("create", "serviceaccount", "probe", "-n", real_namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": real_namespace},
        "spec": {
            "serviceAccountName": "probe",
            "containers": [
                {
                    "name": "probe",
                    "image": DEMO_IMAGE,
                    "command": ["sh", "-c", "echo serving; exec python3 -m http.server 8080"],
                    "workingDir": "/opt/apportion",
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                    "securityContext": RESTRICTED,
                }
            ],
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))  # accepted under `restricted`
    kubectl("wait", "-n", real_namespace, "--for=condition=Ready", "pod/probe", "--timeout=60s")

    status = who_am_i(real_cluster, real_namespace, "probe")  # exec works
    assert status["userInfo"]["username"] == f"system:serviceaccount:{real_namespace}:probe"
    assert status["userInfo"]["extra"]["authentication.kubernetes.io/node-name"] == [NODE_NAME]
    wait_for(
        lambda: "serving" in kubectl("logs", "-n", real_namespace, "probe").stdout,
        message="kubectl logs never showed the container's output",
    )
    assert _through_port_forward(real_cluster, real_namespace, "pod/probe", 8080) == 200


def _through_port_forward(cluster: DevCluster, namespace: str, target: str, port: int) -> int:
    forward = subprocess.Popen(
        [str(cluster.bin_dir / "kubectl"), "port-forward", "-n", namespace, target, f":{port}"],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> 8080"
        local = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert local, f"kubectl port-forward said {line!r}"
        with urllib.request.urlopen(f"http://127.0.0.1:{local.group(1)}/", timeout=10) as answer:
            return int(answer.status)
    finally:
        forward.terminate()
        forward.wait()


@pytest.fixture(scope="module")
def installed_operator(real_cluster: DevCluster) -> DevCluster:
    """The operator as a user installs it: manifests/ as they are, the image they name being the
    one built here (the node holds it under the published names)."""
    real_cluster.kubectl("apply", "-k", str(REPO / "manifests"))
    real_cluster.kubectl(
        "rollout", "status", "-n", SYSTEM, "statefulset/apportion-operator", "--timeout=180s"
    )
    return real_cluster


def _pods(cluster: DevCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    listing = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return json.loads(listing.stdout)["items"]


def test_the_operator_runs_from_its_manifests_as_a_restricted_pod_pair(
    installed_operator: DevCluster,
) -> None:
    pods = _pods(installed_operator, SYSTEM, "app.kubernetes.io/name=apportion-operator")
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["spec"]["serviceAccountName"] == "apportion-operator"
        (container,) = pod["spec"]["containers"]
        assert container["image"] == OPERATOR_IMAGE
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] is True
        assert "running" in status["state"]
        assert status["restartCount"] == 0
    labels = json.loads(
        installed_operator.kubectl("get", "namespace", SYSTEM, "-o", "json").stdout
    )["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def sample(name: str) -> str:
    return (REPO / "manifests" / "samples" / name).read_text()


def _condition(resource: dict[str, Any], kind: str) -> str | None:
    for condition in resource.get("status", {}).get("conditions", []):
        if condition["type"] == kind:
            return str(condition["status"])
    return None


def _assignment(cluster: DevCluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)


@dataclass(frozen=True)
class UnitSample:
    file: str
    kind: str
    name: str
    workers: str  # StatefulSet, its ServiceAccount and its `app` label
    units: int
    replicas: int


UNIT_SAMPLES = (
    UnitSample("partitionset-demo.yaml", "partitionset", "demo", "demo-workers", 32, 4),
    UnitSample("shardset-demo.yaml", "shardset", "carts", "cart-workers", 1000, 3),
)


@pytest.mark.parametrize("demo", UNIT_SAMPLES, ids=lambda s: s.kind)
def test_workers_follow_the_placement_as_containers_through_scale_in_and_rollout(
    installed_operator: DevCluster, wait_for: Callable[..., Any], demo: UnitSample
) -> None:
    cluster = installed_operator
    namespace = f"{demo.kind}-{secrets.token_hex(3)}"
    workers, selector = f"statefulset/{demo.workers}", f"app={demo.workers}"
    every_unit = sorted(str(u) for u in range(demo.units))
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sample(demo.file))

        def balanced_over(members: int) -> dict[str, Any] | None:
            found = _assignment(cluster, namespace, demo.kind, demo.name)
            status = found.get("status", {})
            if _condition(found, "Balanced") != "True" or _condition(found, "Ready") != "True":
                return None
            return status if status.get("members") == members else None

        wait_for(lambda: balanced_over(demo.replicas), timeout=180, message="never Balanced")
        status = who_am_i(cluster, namespace, f"{demo.workers}-0")
        assert status["userInfo"]["username"] == (
            f"system:serviceaccount:{namespace}:{demo.workers}"
        )
        # The kubelet's token names the pod, and the worker policy holds it to that pod: its
        # own acks go through (every hand-off below is acknowledged), a forged one does not.
        extra = status["userInfo"]["extra"]
        assert extra["authentication.kubernetes.io/pod-name"] == [f"{demo.workers}-0"]
        forged = cluster.kubectl(
            "exec", "-n", namespace, f"{demo.workers}-0", "--",
            "python3", "-c", FORGE_ACK, f"{demo.workers}-1",
        )  # fmt: skip
        code, message = json.loads(forged.stdout)
        assert code == 403, message
        assert "apportion-worker-writes" in message, message

        # Scale in: the kubelet sends SIGTERM to the last pod, which drains its units through
        # hand-offs before it exits.
        fewer = demo.replicas - 1
        cluster.kubectl("scale", "-n", namespace, workers, f"--replicas={fewer}")
        wait_for(lambda: balanced_over(fewer), timeout=180, message="never Balanced after scale-in")
        wait_for(
            lambda: len(_pods(cluster, namespace, selector)) == fewer,
            message="the last pod never went (it exits once drained)",
        )
        served = wait_for(
            lambda: _serving_every_unit_once(cluster, namespace, selector, every_unit),
            message="the remaining workers never served every unit once",
        )
        assert set(served) == {f"{demo.workers}-{i}" for i in range(fewer)}

        # A rolling restart: the StatefulSet controller replaces one pod at a time, the kubelet
        # sends each SIGTERM, and each drains through hand-offs before it exits.
        before = {p["metadata"]["uid"] for p in _pods(cluster, namespace, selector)}
        cluster.kubectl("rollout", "restart", "-n", namespace, workers)
        cluster.kubectl(
            "rollout", "status", "-n", namespace, workers, "--timeout=300s", timeout=320
        )
        after = {p["metadata"]["uid"] for p in _pods(cluster, namespace, selector)}
        assert not before & after  # every pod was replaced
        wait_for(lambda: balanced_over(fewer), timeout=180, message="never Balanced after rollout")
        # The last pod replaced may still be starting its worker when it counts as Ready (the
        # sample has no readiness probe): ask until every unit is served, once.
        wait_for(
            lambda: _serving_every_unit_once(cluster, namespace, selector, every_unit),
            message="after the rollout the workers never served every unit once",
        )
        # Every pod that left acknowledged its hand-offs: none was forced by a timeout.
        events = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
        reasons = {e["reason"] for e in json.loads(events)["items"]}
        assert "HandoffTimedOut" not in reasons
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _serving_every_unit_once(
    cluster: DevCluster, namespace: str, selector: str, every_unit: list[str]
) -> dict[str, list[str]] | None:
    """What each worker serves, once together they serve every unit exactly once; else None
    (also while a worker does not answer yet)."""
    try:
        served = _served_by_pod(cluster, namespace, selector)
    except KubectlError:
        return None
    held = sorted(u for units in served.values() for u in units)
    return served if held == every_unit else None


def _served_by_pod(cluster: DevCluster, namespace: str, selector: str) -> dict[str, list[str]]:
    """What each worker says it serves (GET /units inside its container)."""
    served = {}
    for pod in _pods(cluster, namespace, selector):
        name = pod["metadata"]["name"]
        answer = cluster.kubectl(
            "exec",
            "-n",
            namespace,
            name,
            "--",
            "python3",
            "-c",
            "import urllib.request;"
            "print(urllib.request.urlopen('http://127.0.0.1:8080/units').read().decode())",
        )
        served[name] = list(json.loads(answer.stdout)["units"])
    return served


# Placed by count, a fresh set deals partition u to the (u mod 4)-th pod: these six start on one
# pod, and only their measured CPU can spread them. Each costs 50 millicores, the others 3: a
# hot partition is well below a pod's fair share, so spreading them is what Balanced must do.
HOT_UNITS = ("0", "4", "8", "12", "16", "20")
MOST_HOT_PER_POD = 2  # six over four pods


def burning_sample() -> str:
    """The PartitionSet sample with workers that spend real CPU on their partitions: 50
    millicores on each hot one, 3 on each other, reported as measured CPU per unit;
    and the operator reading pod CPU from metrics.k8s.io (the workers request CPU, so a pod's
    usage has a percentage)."""
    documents = list(yaml.safe_load_all(sample("partitionset-demo.yaml")))
    for document in documents:
        if document["kind"] == "StatefulSet":
            (container,) = document["spec"]["template"]["spec"]["containers"]
            command = container["command"]
            profile = ",".join(f"{u}=2" for u in HOT_UNITS) + ",*=0.12"
            command[command.index("--load-profile") + 1] = f"units:{profile}"
            command += ["--burn-cpu", "25"]
            container["resources"] = {"requests": {"cpu": "100m"}}
        if document["kind"] == "PartitionSet":
            document["spec"]["metrics"]["podMetrics"] = True
    return yaml.safe_dump_all(documents)


def test_balanced_moves_partitions_for_the_cpu_they_really_cost(
    installed_operator: DevCluster, wait_for: Callable[..., Any]
) -> None:
    cluster = installed_operator
    namespace = f"burn-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=burning_sample())
        owners_seen: list[dict[str, str]] = []
        last_status: list[dict[str, Any]] = []

        def hot_units_spread_by_measured_load() -> dict[str, Any] | None:
            pset = _assignment(cluster, namespace, "partitionset", "demo")
            status = pset.get("status", {})
            table = cluster.kubectl(
                "get",
                "configmap",
                "demo-partitionset-assignment",
                "-n",
                namespace,
                "-o",
                "jsonpath={.data.assignments\\.json}",
                check=False,
            ).stdout
            if not table:
                return None
            units = json.loads(table)["units"]
            owners_seen.append({u: units.get(u, "") for u in HOT_UNITS})
            per_pod = Counter(units.get(u) for u in HOT_UNITS)
            spread = max(per_pod.values()) <= MOST_HOT_PER_POD
            last_status[:] = [status]
            measured = status.get("metricsSource") == "PodMetricsAndWorkerLoad"
            settled = _condition(pset, "Balanced") == "True" and status.get("members") == 4
            return status if spread and measured and settled else None

        try:
            wait_for(hot_units_spread_by_measured_load, timeout=240)
        except pytest.fail.Exception:
            pytest.fail(
                "the hot partitions never ended on different pods by measured CPU: "
                f"{owners_seen[-1:]} {json.dumps(last_status)[:3000]}"
            )
        top = cluster.kubectl("top", "pods", "-n", namespace, "--no-headers").stdout
        assert len(top.splitlines()) == 4  # metrics-server measures every worker
        # ...and they got there by moving: at first, by count, they shared a pod.
        assert any(len(set(owners.values())) == 1 for owners in owners_seen), owners_seen[:3]
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


LEADER = re.compile(r"^apportion_operator_leader (\S+)$", re.MULTILINE)


def _leads(cluster: DevCluster, pod: str) -> bool | None:
    """What the operator pod's own /metrics says (read from inside its container)."""
    scrape = cluster.kubectl(
        "exec",
        "-n",
        SYSTEM,
        pod,
        "--",
        "python3",
        "-c",
        "import urllib.request;"
        "print(urllib.request.urlopen('http://127.0.0.1:8081/metrics').read().decode())",
        check=False,
    )
    found = LEADER.search(scrape.stdout)
    return None if found is None else float(found.group(1)) == 1


def _resumes(cluster: DevCluster, pod: str) -> int:
    log = cluster.kubectl("logs", "-n", SYSTEM, pod, check=False).stdout
    return log.count("Leading (Lease")


def test_the_standby_takes_over_when_the_kubelet_stops_the_active_operator(
    installed_operator: DevCluster, wait_for: Callable[..., Any]
) -> None:
    cluster = installed_operator
    pods = ("apportion-operator-0", "apportion-operator-1")
    active = wait_for(
        lambda: next((p for p in pods if _leads(cluster, p)), None),
        timeout=60,
        message="no operator pod leads",
    )
    (standby,) = (p for p in pods if p != active)
    assert _leads(cluster, standby) is False
    resumed_before = _resumes(cluster, standby)
    # The kubelet sends SIGTERM; the active replica gives up the Lease, and the standby takes
    # over within a retry period rather than after the Lease expires.
    cluster.kubectl("delete", "pod", "-n", SYSTEM, active, "--wait=false")
    wait_for(
        lambda: _resumes(cluster, standby) > resumed_before,
        timeout=45,
        message=f"{standby} never took the lead",
    )
    # ...and places a new set while the deleted pod is recreated.
    _places_a_new_set(cluster, wait_for, "ha", 120, "the standby never made the new set Ready")


def _places_a_new_set(
    cluster: DevCluster, wait_for: Callable[..., Any], prefix: str, timeout: float, failure: str
) -> None:
    """The PartitionSet sample in a namespace of its own turns Ready: the operator works."""
    namespace = f"{prefix}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sample("partitionset-demo.yaml"))
        wait_for(
            lambda: (
                _condition(_assignment(cluster, namespace, "partitionset", "demo"), "Ready")
                == "True"
            ),
            timeout=timeout,
            message=failure,
        )
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def deployment_sample() -> str:
    """The PartitionSet sample on a 3-replica Deployment instead of a StatefulSet: a ReplicaSet
    chooses which pod a scale-in removes, by `controller.kubernetes.io/pod-deletion-cost`."""
    documents = list(yaml.safe_load_all(sample("partitionset-demo.yaml")))
    for document in documents:
        if document["kind"] == "StatefulSet":
            document["kind"] = "Deployment"
            for field in ("serviceName", "podManagementPolicy"):
                document["spec"].pop(field)
            document["spec"]["replicas"] = 3
        if document["kind"] == "PartitionSet":
            document["spec"]["workloadRef"]["kind"] = "Deployment"
    return yaml.safe_dump_all(documents)


def test_a_deployment_scale_in_removes_the_pod_the_deletion_cost_names(
    installed_operator: DevCluster, wait_for: Callable[..., Any]
) -> None:
    """Drain one pod (it hands every partition off and its deletion cost drops to 0), then scale
    the Deployment in: the real ReplicaSet controller removes that pod, not another."""
    cluster = installed_operator
    namespace = f"deploy-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=deployment_sample())

        def costs() -> dict[str, int] | None:
            pods = _pods(cluster, namespace, "app=demo-workers")
            found = {
                p["metadata"]["name"]: p["metadata"].get("annotations", {}).get(DELETION_COST)
                for p in pods
            }
            if len(found) != 3 or None in found.values():
                return None
            return {name: int(cost) for name, cost in found.items()}

        wait_for(
            lambda: (c := costs()) and sum(c.values()) == 32,
            timeout=180,
            message="the workers never carried their partition counts as deletion costs",
        )
        drained = sorted(costs() or {})[1]
        cluster.kubectl("annotate", "pod", "-n", namespace, drained, "apportion.dev/drain=true")
        wait_for(
            lambda: (c := costs()) and c[drained] == 0 and sum(c.values()) == 32,
            timeout=120,
            message=f"{drained} never handed everything off",
        )
        cluster.kubectl("scale", "-n", namespace, "deployment/demo-workers", "--replicas=2")
        wait_for(
            lambda: (
                len(
                    names := {
                        p["metadata"]["name"] for p in _pods(cluster, namespace, "app=demo-workers")
                    }
                )
                == 2
                and drained not in names
            ),
            timeout=120,
            message=f"the ReplicaSet did not remove {drained}",
        )
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# Run inside a demo worker container: the HTTP status and body it gives a key of each partition
# named on the command line (netherite `k!n` names partition n), as JSON.
ASK_KEYS = textwrap.dedent(
    """
    import json, sys, urllib.error, urllib.request
    answers = {}
    for unit in sys.argv[1:]:
        try:
            answer = urllib.request.urlopen(f"http://127.0.0.1:8080/key/k!{unit}")
        except urllib.error.HTTPError as error:
            answer = error
        answers[unit] = [answer.status, answer.read().decode()]
    print(json.dumps(answers))
    """
)


def _pod_netns(pod_ip: str) -> str:
    """The network namespace (under /run/netns) CNI made for the pod with `pod_ip`."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in (line.split()[0] for line in names.splitlines() if line.strip()):
        addresses = subprocess.run(
            ["ip", "netns", "exec", name, "ip", "-4", "-o", "addr"], capture_output=True, text=True
        ).stdout
        if f" {pod_ip}/" in addresses:
            return name
    raise LookupError(f"no network namespace holds {pod_ip}")


@dataclass
class CutOffDemo:
    """The PartitionSet sample under `whenCutOff: <policy>` with handoffTimeout 20 s (serving
    lease 20/3 s), Balanced, every unit served once; `cut_and_drain()` then cuts pod-0 off from
    the API server and drains it."""

    cluster: DevCluster
    namespace: str
    held: list[str]  # pod-0's units before the cut
    victim: str = "demo-workers-0"
    netns: str = ""
    rules: list[list[str]] = field(default_factory=list)
    cut: float = 0.0
    answers: dict[str, list[Any]] = field(default_factory=dict)

    def cut_and_drain(self, wait_for: Callable[..., Any]) -> list[str]:
        """Drop pod-0's packets to the API server in its own network namespace (iptables), and
        only those: the pod still reaches anything else, PostgreSQL on the host included. Then
        drain it, and return its units once the table gives every one to another pod."""
        kubectl = self.cluster.kubectl
        pod = json.loads(
            kubectl("get", "pod", self.victim, "-n", self.namespace, "-o", "json").stdout
        )
        self.netns = _pod_netns(pod["status"]["podIP"])
        service = json.loads(
            kubectl("get", "service", "kubernetes", "-n", "default", "-o", "json").stdout
        )
        # Both ways: with only the pod's packets dropped, the API server's still arrive, and a
        # watch delivers the next table or two over its open connection before the server stops
        # sending for want of ACKs; the pod would then see its release. The worker dials the
        # Service, which kube-proxy translates on the host, outside the pod's namespace; the
        # API server's own address (on the bridge) is dropped too, for a connection made there.
        slices = kubectl(
            "get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes",
            "-o", "jsonpath={.items[0].ports[0].port}",
        ).stdout  # fmt: skip
        for address, port in (
            (service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]),
            (GATEWAY, int(slices)),
        ):
            for rule in (
                ["OUTPUT", "-d", address, "-p", "tcp", "--dport", str(port), "-j", "DROP"],
                ["INPUT", "-s", address, "-p", "tcp", "--sport", str(port), "-j", "DROP"],
            ):
                subprocess.run(
                    ["ip", "netns", "exec", self.netns, "iptables", "-I", *rule], check=True
                )
                self.rules.append(rule)
        self.cut = time.time()
        kubectl("annotate", "pod", self.victim, "-n", self.namespace, "apportion.dev/drain=true")

        def moved() -> list[str] | None:
            now = _table_of(self.cluster, self.namespace)
            gone = [u for u in self.held if now.get(u) not in (self.victim, None)]
            return gone if len(gone) == len(self.held) else None

        lost: list[str] = wait_for(moved, timeout=90, message="pod-0's units never moved")
        return lost

    def lift(self) -> None:
        while self.rules:
            rule = self.rules.pop()
            subprocess.run(
                ["ip", "netns", "exec", self.netns, "iptables", "-D", *rule], check=False
            )

    def ask(self, pod: str, units: list[str]) -> dict[str, int]:
        """The HTTP status `pod` gives a GET of key `k!u` (in partition u) for each unit; the
        bodies are kept in `answers` for failure messages."""
        asked = self.cluster.kubectl(
            "exec", "-n", self.namespace, pod, "--", "python3", "-c", ASK_KEYS, *units
        )
        self.answers = json.loads(asked.stdout)
        return {unit: int(status) for unit, (status, _) in self.answers.items()}

    def log(self, pod: str) -> str:
        return self.cluster.kubectl("logs", "-n", self.namespace, pod).stdout

    def ownership(self) -> list[Ownership]:
        """Every worker's ownership lines, in time order."""
        log = []
        for i in range(4):
            log += ownership_lines(
                self.log(f"demo-workers-{i}"), f"demo-workers-{i}", "PartitionSet/demo"
            )
        return sorted(log, key=lambda o: o.time)


@contextmanager
def cut_off_demo(
    cluster: DevCluster,
    wait_for: Callable[..., Any],
    policy: str,
    postgres: str | None = None,
) -> Iterator[CutOffDemo]:
    """A CutOffDemo in a namespace of its own; with `postgres`, the workers write every request
    by key there through fenced writes. The cut is lifted and the namespace deleted after."""
    namespace = f"cut-{secrets.token_hex(3)}"
    docs = [d for d in yaml.safe_load_all(sample("partitionset-demo.yaml")) if d]
    for doc in docs:
        if doc["kind"] == "PartitionSet":
            doc["spec"]["rebalance"].update(handoffTimeout="20s", whenCutOff=policy)
        if doc["kind"] == "StatefulSet" and postgres is not None:
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            container["env"].append({"name": "APPORTION_DEMO_POSTGRES", "value": postgres})
    cluster.kubectl("create", "namespace", namespace)
    demo: CutOffDemo | None = None
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
        wait_for(
            lambda: (
                _condition(_assignment(cluster, namespace, "partitionset", "demo"), "Balanced")
                == "True"
            ),
            timeout=180,
            message="never Balanced",
        )
        every_unit = sorted(str(u) for u in range(32))
        served = wait_for(
            lambda: _serving_every_unit_once(cluster, namespace, "app=demo-workers", every_unit),
            message="the workers never served every unit once",
        )
        demo = CutOffDemo(cluster, namespace, sorted(served["demo-workers-0"], key=int))
        assert demo.held
        yield demo
    finally:
        if demo is not None:
            demo.lift()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# Before the Helm test, which replaces the kustomize install and uninstalls it at the end.
def test_a_worker_cut_off_from_the_api_server_stops_before_its_units_move(
    installed_operator: DevCluster, wait_for: Callable[..., Any]
) -> None:
    """The issue's fault injection: pod-0's packets to the API server dropped in its own network
    namespace (iptables), its units released by a drain: it stops serving when its lease runs
    out, before handoffTimeout gives them to the others, so no unit is ever served by two pods
    (judged from the workers' own logs and by asking pod-0 for every key it lost)."""
    cluster = installed_operator
    with cut_off_demo(cluster, wait_for, "StopServing") as demo:
        lost = demo.cut_and_drain(wait_for)
        assert 200 not in demo.ask(demo.victim, lost).values()
        events = json.loads(
            cluster.kubectl("get", "events", "-n", demo.namespace, "-o", "json").stdout
        )
        assert "HandoffTimedOut" in {e["reason"] for e in events["items"]}
        demo.lift()
        log = demo.ownership()
        assert overlaps(log) == []
        stopped = [
            o.time
            for o in log
            if o.pod == demo.victim and o.action == "suspend" and o.time > demo.cut
        ]
        taken = [
            o.time for o in log if o.pod != demo.victim and o.action == "acquire" and o.unit in lost
        ]
        assert stopped
        assert taken
        assert max(stopped) < min(taken)
        print(
            f"\ncut → pod-0 stopped serving: {min(stopped) - demo.cut:.1f}s; "
            f"cut → first unit taken over: {min(taken) - demo.cut:.1f}s"
        )


def test_a_worker_cut_off_under_keep_serving_overlaps_and_postgres_refuses_its_writes(
    installed_operator: DevCluster, wait_for: Callable[..., Any]
) -> None:
    """The same cut under `whenCutOff: KeepServing`: pod-0 goes on serving the units it lost,
    beside their new owners, until it sees the table again; each request writes to PostgreSQL
    through apportion.fencing under the unit's token, and the store refuses pod-0's writes once
    a new owner wrote. The overlap is measured from the workers' own logs."""
    cluster = installed_operator
    # On the bridge, where pods reach the host; trusted from the pod network only.
    with (
        PostgresServer(address=GATEWAY, clients=CLUSTER_CIDR) as server,
        cut_off_demo(cluster, wait_for, "KeepServing", server.dsn()) as demo,
    ):
        victim = demo.victim
        # Before the cut pod-0's writes go through under its tokens.
        assert set(demo.ask(victim, demo.held).values()) == {200}, demo.answers
        uid = _assignment(cluster, demo.namespace, "partitionset", "demo")["metadata"]["uid"]
        scope = f"PartitionSet/{demo.namespace}/demo/{uid}"
        old_tokens = _fence_tokens(server.dsn(), scope)
        assert set(old_tokens) == set(demo.held)

        lost = demo.cut_and_drain(wait_for)
        owners: dict[str, str | None] = {}
        tokens: dict[str, int] = {}

        def new_owners_served() -> bool:
            # The owners of the table at the time: Balanced may still move a unit on after the
            # timeout gave it to someone (pod-0 drains), and only an owner serves it.
            table = read_table(cluster.kubectl, demo.namespace, "PartitionSet", "demo")
            assert table is not None
            owners.update({u: table.units[u].owner for u in lost})
            tokens.update({u: table.units[u].epoch for u in lost})
            return (
                all(
                    set(demo.ask(owner, [u for u in lost if owners[u] == owner]).values()) == {200}
                    for owner in set(owners.values())
                    if owner is not None
                )
                and None not in owners.values()
            )

        try:
            wait_for(new_owners_served)
        except pytest.fail.Exception:
            pytest.fail(f"the new owners {owners} never served the units: {demo.answers}")
        # pod-0 still serves them (KeepServing: it never stopped) but the store refuses it.
        stale = demo.ask(victim, lost)
        assert set(stale.values()) == {409}, demo.answers
        refused = [line for line in demo.log(victim).splitlines() if " refused unit=" in line]
        assert len(refused) == len(lost)
        fence = _fence_tokens(server.dsn(), scope)
        with psycopg.connect(server.dsn()) as conn:
            last_writers: dict[str, str] = dict(
                conn.execute(
                    "SELECT unit, pod FROM apportion_demo_requests WHERE scope = %s", (scope,)
                ).fetchall()
            )
        for unit in lost:
            assert fence[unit] == tokens[unit] > old_tokens[unit]
            assert last_writers[unit] == owners[unit]

        demo.lift()
        lifted = time.time()
        # pod-0 sees the table again (its watch, silent through the cut, gives up and lists
        # again), and stops serving what it lost: answers name the owner.
        wait_for(
            lambda: set(demo.ask(victim, lost).values()) == {421},
            timeout=240,
            message="pod-0 never stopped serving the units it lost",
        )
        log = demo.ownership()
        assert overlaps(log)  # the check the StopServing test relies on sees this one
        spans = overlap_spans(log)
        assert set(spans) == set(lost), spans
        assert all(math.isfinite(s) for s in spans.values()), spans
        stopped = max(o.time for o in log if o.pod == victim and o.unit in lost)
        print(
            f"\nKeepServing: {len(lost)} units served by two pods for "
            f"{min(spans.values()):.1f}-{max(spans.values()):.1f}s; cut → pod-0 stopped them: "
            f"{stopped - demo.cut:.1f}s (cut lifted after {lifted - demo.cut:.1f}s); "
            f"{len(refused)} writes of pod-0 refused by the fence, none committed"
        )


def _fence_tokens(dsn: str, scope: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT unit, token FROM apportion_fence WHERE scope = %s", (scope,))
        return {unit: int(token) for unit, token in rows.fetchall()}


def _table_of(cluster: DevCluster, namespace: str) -> dict[str, str | None]:
    """unit → owner in the PartitionSet demo's published table."""
    table = read_table(cluster.kubectl, namespace, "PartitionSet", "demo")
    assert table is not None
    return {unit: state.owner for unit, state in table.units.items()}


def test_helm_installs_the_operator_on_the_real_node(
    installed_operator: DevCluster, helm: Callable[..., Any], wait_for: Callable[..., Any]
) -> None:
    """docs/operations.md's other way in: the kustomize install goes (but the CRDs, which the
    sets of earlier tests live on), `helm install` brings the operator pair back as containers
    from the image built here, it places a new set, and `helm uninstall` removes it. Last in
    this module: it takes the kustomize install away."""
    cluster = installed_operator
    rendered = yaml.safe_load_all(cluster.kubectl("kustomize", str(REPO / "manifests")).stdout)
    without_crds = [d for d in rendered if d and d["kind"] != "CustomResourceDefinition"]
    cluster.kubectl("delete", "-f", "-", "--wait=true", input=yaml.safe_dump_all(without_crds))
    wait_for(
        lambda: cluster.kubectl("get", "namespace", SYSTEM, check=False).returncode != 0,
        timeout=180,
        message=f"the kustomize install's namespace {SYSTEM} never went",
    )
    release = ("apportion", str(REPO / "charts" / "apportion"), "-n", SYSTEM)
    kubeconfig = f"--kubeconfig={cluster.kubeconfig}"
    helm(
        "install",
        *release,
        kubeconfig,
        "--create-namespace",
        "--wait",
        "--timeout=180s",
    )
    pods = _pods(cluster, SYSTEM, "app.kubernetes.io/name=apportion-operator")
    assert len(pods) == 2
    for pod in pods:
        assert pod["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "Helm"
        assert pod["spec"]["nodeName"] == NODE_NAME
        assert pod["spec"]["containers"][0]["image"] == OPERATOR_IMAGE
        assert all(s["ready"] for s in pod["status"]["containerStatuses"])

    _places_a_new_set(
        cluster, wait_for, "helm", 180, "the operator Helm installed never made the set Ready"
    )
    helm("uninstall", "apportion", "-n", SYSTEM, kubeconfig, "--wait")
    gone = cluster.kubectl("get", "statefulset", "-n", SYSTEM, "-o", "name", check=False)
    assert gone.stdout.strip() == ""
