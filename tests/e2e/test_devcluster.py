"""The dev-cluster itself: a real API server and controller-manager, and pods that behave as on a
cluster with kubelets (bound, Running/Ready with loopback IPs, graceful deletion, processes)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from apportion_dev.devcluster import SIMULATE_ANNOTATION, DevCluster, DevClusterError
from apportion_dev.devcluster.net import http_get
from apportion_dev.devcluster.paths import module_versions
from apportion_dev.devcluster.processes import ProcessRecord, is_running

GRACE = 2


def pods(cluster: DevCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout
    return sorted(json.loads(out)["items"], key=lambda p: p["metadata"]["name"])


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return pod["status"].get("phase") == "Running" and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def ready_pods(cluster: DevCluster, namespace: str, selector: str, count: int):
    """The pods once exactly `count` exist and all are Ready and not terminating."""

    def check() -> list[dict[str, Any]] | None:
        found = pods(cluster, namespace, selector)
        live = [p for p in found if not p["metadata"].get("deletionTimestamp")]
        return found if len(found) == count == len(live) and all(map(is_ready, found)) else None

    return check


def assert_simulated(found: list[dict[str, Any]]) -> None:
    ips = [p["status"]["podIP"] for p in found]
    assert len(set(ips)) == len(ips), f"pod IPs are not unique: {ips}"
    for pod, ip in zip(found, ips, strict=True):
        assert ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8")
        assert pod["spec"]["nodeName"].startswith("sim-node-")
        assert all(
            c["ready"] and "running" in c["state"] for c in pod["status"]["containerStatuses"]
        )


def test_api_server_is_ready(dev_cluster: DevCluster) -> None:
    assert dev_cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
    assert dev_cluster.readyz() == "ok"


def test_kubectl_and_server_report_the_pinned_version(dev_cluster: DevCluster) -> None:
    pinned = module_versions().kubernetes
    assert pinned.startswith("v1.37.")
    versions = json.loads(dev_cluster.kubectl("version", "-o", "json").stdout)
    assert versions["clientVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["gitTreeState"] == "clean"


def test_simulated_nodes_are_ready_in_three_zones(dev_cluster: DevCluster) -> None:
    nodes = json.loads(dev_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    zones = {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes}
    assert zones == {"zone-a", "zone-b", "zone-c"}
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]


def test_statefulset_scales_up_and_down(dev_cluster: DevCluster, namespace: str, wait_for) -> None:
    manifest = f"""
apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: web, namespace: {namespace}}}
spec:
  replicas: 2
  serviceName: web
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: {GRACE}
      containers: [{{name: main, image: example.invalid/web:1}}]
"""
    dev_cluster.kubectl("apply", "-f", "-", input=manifest)
    two = wait_for(ready_pods(dev_cluster, namespace, "app=web", 2), message="2 web pods Ready")
    assert [p["metadata"]["name"] for p in two] == ["web-0", "web-1"]
    assert_simulated(two)

    dev_cluster.kubectl("scale", "statefulset/web", "-n", namespace, "--replicas=3")
    three = wait_for(ready_pods(dev_cluster, namespace, "app=web", 3), message="3 web pods Ready")
    assert [p["metadata"]["name"] for p in three] == ["web-0", "web-1", "web-2"]
    assert_simulated(three)
    wait_for(
        lambda: (
            json.loads(
                dev_cluster.kubectl("get", "statefulset/web", "-n", namespace, "-o", "json").stdout
            )["status"].get("readyReplicas")
            == 3
        ),
        message="the StatefulSet reports 3 ready replicas",
    )

    dev_cluster.kubectl("scale", "statefulset/web", "-n", namespace, "--replicas=2")
    terminating = wait_for(
        lambda: [
            p
            for p in pods(dev_cluster, namespace, "app=web")
            if p["metadata"].get("deletionTimestamp")
        ],
        message="web-2 is terminating",
    )
    assert [p["metadata"]["name"] for p in terminating] == ["web-2"]
    # The simulated container ignores SIGTERM: the pod waits out the grace period it was given
    # (how long that takes is the simulator's figure, not this test's).
    assert terminating[0]["metadata"]["deletionGracePeriodSeconds"] == GRACE
    remaining = wait_for(ready_pods(dev_cluster, namespace, "app=web", 2), message="web-2 is gone")
    assert [p["metadata"]["name"] for p in remaining] == ["web-0", "web-1"]
    assert [p["status"]["podIP"] for p in remaining] == [p["status"]["podIP"] for p in two]


def deployment(namespace: str, name: str, replicas: int = 1) -> str:
    return json.dumps(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": f"example.invalid/{name}:1"}],
                    },
                },
            },
        }
    )


def test_deployment_pods_come_up(dev_cluster: DevCluster, namespace: str, wait_for) -> None:
    dev_cluster.kubectl("apply", "-f", "-", input=deployment(namespace, "api", replicas=3))
    dev_cluster.kubectl("rollout", "status", "deployment/api", "-n", namespace, "--timeout=60s")
    assert_simulated(wait_for(ready_pods(dev_cluster, namespace, "app=api", 3)))


PROCESS_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    def on_term(signum, frame):
        print("got SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    for key in ("POD_NAME", "POD_NAMESPACE", "POD_IP", "ROLE", "GREETING", "KUBECONFIG"):
        print(f"{key}={os.environ.get(key)}", flush=True)
    print("argv=" + " ".join(sys.argv[1:]), flush=True)
    while True:
        time.sleep(0.1)
    """
)


def process_pod(namespace: str, name: str, command: list[str], **spec: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app": name, "role": "worker"},
                "annotations": {SIMULATE_ANNOTATION: "process"},
            },
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "example.invalid/worker:1",
                        "command": command,
                        "args": ["--hello", "$(GREETING)"],
                        "env": [
                            {
                                "name": "NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            },
                            {
                                "name": "ROLE",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}},
                            },
                            {"name": "GREETING", "value": "hi-$(NAME)"},
                        ],
                    }
                ],
                **spec,
            },
        }
    )


def test_process_pod_runs_its_command_and_gets_sigterm(
    dev_cluster: DevCluster, namespace: str, wait_for
) -> None:
    # A grace period far beyond any wait below: the pod can only go because its process exited
    # on SIGTERM, not because the grace period ran out.
    manifest = process_pod(
        namespace, "proc", ["python", "-c", PROCESS_SCRIPT], terminationGracePeriodSeconds=3600
    )
    dev_cluster.kubectl("apply", "-f", "-", input=manifest)
    (pod,) = wait_for(ready_pods(dev_cluster, namespace, "app=proc", 1), message="proc Ready")
    log_path = dev_cluster.pod_log_path(namespace, "proc")
    log = wait_for(
        lambda: log_path.exists() and "argv=" in log_path.read_text() and log_path.read_text(),
        message=f"the process writes its environment to {log_path}",
    )
    assert "POD_NAME=proc" in log
    assert f"POD_NAMESPACE={namespace}" in log
    assert f"POD_IP={pod['status']['podIP']}" in log
    assert "ROLE=worker" in log
    assert "GREETING=hi-proc" in log
    # Its own credentials (test_process_pod_is_its_service_account), not the simulator's.
    assert f"KUBECONFIG={dev_cluster.pod_log_path(namespace, 'proc').parent}/proc.kubeconfig" in log
    assert "argv=--hello hi-proc" in log

    dev_cluster.kubectl("delete", "pod", "proc", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not pods(dev_cluster, namespace, "app=proc"),
        timeout=300,
        message="proc is deleted once its process exits on SIGTERM",
    )
    assert "got SIGTERM" in log_path.read_text()


IDENTITY_SCRIPT = textwrap.dedent(
    """
    import json, os, time
    from lightkube import ApiError, Client, KubeConfig
    from lightkube.resources.authentication_v1 import SelfSubjectReview
    from lightkube.resources.core_v1 import Secret
    print(f"KUBECONFIG={os.environ.get('KUBECONFIG')}", flush=True)
    if os.environ.get("KUBECONFIG"):
        client = Client(KubeConfig.from_file(os.environ["KUBECONFIG"]), trust_env=False)
        user = client.create(SelfSubjectReview()).status.userInfo
        print("user=" + json.dumps({"name": user.username, "extra": user.extra}), flush=True)
        try:
            list(client.list(Secret))
            print("secrets=listed", flush=True)
        except ApiError as error:
            print(f"secrets={error.status.code}", flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_process_pod_is_its_service_account(
    dev_cluster: DevCluster, namespace: str, wait_for
) -> None:
    """As under a kubelet, a process pod talks to the API server as its ServiceAccount with a
    token bound to the pod: it has that account's RBAC only, the token names the pod, and it
    stops working once the pod is gone; `automountServiceAccountToken: false` gets none."""
    command = ["python", "-c", IDENTITY_SCRIPT]
    for name, spec in (
        ("as-worker", {"serviceAccountName": "apportion-worker"}),
        ("no-token", {"automountServiceAccountToken": False}),
    ):
        manifest = process_pod(namespace, name, command, terminationGracePeriodSeconds=1, **spec)
        dev_cluster.kubectl("apply", "-f", "-", input=manifest)

    def line(pod: str, key: str) -> str | None:
        path = dev_cluster.pod_log_path(namespace, pod)
        text = path.read_text() if path.exists() else ""
        found = re.search(rf"^{key}=(.*)$", text, re.MULTILINE)
        return found.group(1) if found else None

    secrets = wait_for(lambda: line("as-worker", "secrets"), message="as-worker asked the API")
    user = json.loads(line("as-worker", "user") or "{}")
    (pod,) = pods(dev_cluster, namespace, "app=as-worker")
    assert user["name"] == f"system:serviceaccount:{namespace}:apportion-worker"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["as-worker"]
    assert user["extra"]["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]
    assert secrets == "403", "the worker role grants no Secrets"
    assert wait_for(lambda: line("no-token", "KUBECONFIG"), message="no-token ran") == "None"

    kubeconfig = yaml.safe_load(Path(line("as-worker", "KUBECONFIG") or "").read_text())
    token = Path(kubeconfig["users"][0]["user"]["tokenFile"]).read_text()

    def answer() -> int:
        # Discovery: any authenticated user may read it, so only the token decides.
        return http_get(f"{dev_cluster.server}/api", token=token, ca_file=dev_cluster.ca_file)[0]

    assert answer() == 200
    dev_cluster.kubectl("delete", "pod", "as-worker", "-n", namespace, "--wait=true")
    wait_for(lambda: answer() == 401, message="the bound token outlived its pod")


def test_exiting_process_is_restarted(dev_cluster: DevCluster, namespace: str, wait_for) -> None:
    script = "import sys; print('started', flush=True); sys.exit(3)"
    dev_cluster.kubectl(
        "apply", "-f", "-", input=process_pod(namespace, "crash", ["python", "-c", script])
    )

    def restarted_twice() -> dict[str, Any] | None:
        found = pods(dev_cluster, namespace, "app=crash")
        statuses = found[0]["status"].get("containerStatuses") if found else None
        return statuses[0] if statuses and statuses[0]["restartCount"] >= 2 else None

    status = wait_for(restarted_twice, message="the crashing container restarts twice")
    assert status["lastState"]["terminated"]["exitCode"] == 3
    # The status says a run began; its first line may land in the log a moment later.
    log_path = dev_cluster.pod_log_path(namespace, "crash")
    wait_for(
        lambda: log_path.read_text().count("started") >= 3,
        timeout=30,
        message="three runs, each logging its start",
    )


def test_garbage_collector_deletes_dependents(
    dev_cluster: DevCluster, namespace: str, wait_for
) -> None:
    dev_cluster.kubectl("apply", "-f", "-", input=deployment(namespace, "gc"))
    wait_for(ready_pods(dev_cluster, namespace, "app=gc", 1), message="gc pod Ready")
    dev_cluster.kubectl("delete", "deployment", "gc", "-n", namespace, "--wait=false")
    wait_for(
        lambda: (
            not dev_cluster.kubectl(
                "get", "replicasets,pods", "-n", namespace, "-l", "app=gc", "-o", "name"
            ).stdout.strip()
        ),
        message="the ReplicaSet and Pod owned by the deleted Deployment are collected",
    )


def test_namespace_deletion_removes_its_contents(dev_cluster: DevCluster, wait_for) -> None:
    name = "doomed-ns"
    dev_cluster.kubectl("create", "namespace", name)
    dev_cluster.kubectl("create", "configmap", "settings", "-n", name, "--from-literal=a=1")
    dev_cluster.kubectl("apply", "-f", "-", input=deployment(name, "app"))
    wait_for(ready_pods(dev_cluster, name, "app=app", 1), message="pod in doomed-ns Ready")
    dev_cluster.kubectl("delete", "namespace", name, "--wait=false")
    wait_for(
        lambda: dev_cluster.kubectl("get", "namespace", name, check=False).returncode != 0,
        timeout=90,
        message=f"namespace {name} is removed by the namespace controller",
    )


READINESS_SERVER = textwrap.dedent(
    """
    import http.server, os
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if os.path.exists(os.environ["READY_FILE"]) else 503)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer((os.environ["POD_IP"], 8080), Handler).serve_forever()
    """
)


def test_http_readiness_probe_gates_ready(
    dev_cluster: DevCluster, namespace: str, wait_for, tmp_path
) -> None:
    ready_file = tmp_path / "ready"
    manifest = json.loads(
        process_pod(
            namespace,
            "probed",
            ["python", "-c", READINESS_SERVER],
            terminationGracePeriodSeconds=1,
        )
    )
    container = manifest["spec"]["containers"][0]
    container["env"].append({"name": "READY_FILE", "value": str(ready_file)})
    container["ports"] = [{"name": "http", "containerPort": 8080}]
    container["readinessProbe"] = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    dev_cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def running_not_ready() -> dict[str, Any] | None:
        found = pods(dev_cluster, namespace, "app=probed")
        statuses = found[0]["status"].get("containerStatuses") if found else None
        if statuses and "running" in statuses[0]["state"] and not statuses[0]["ready"]:
            return found[0]
        return None

    wait_for(running_not_ready, message="probed runs but is not Ready while the probe fails")
    time.sleep(2)  # a few failing probes later it is still not Ready
    assert not is_ready(pods(dev_cluster, namespace, "app=probed")[0])
    ready_file.touch()
    wait_for(ready_pods(dev_cluster, namespace, "app=probed", 1), message="Ready once probe passes")


def test_start_on_a_half_running_cluster_refuses_in_words(tmp_path) -> None:
    """`dev-cluster start` over a cluster whose simulator died (the API server still up) must
    neither start a second control plane in the same directory nor throw the first one's data
    away: it says what is down and what to do."""
    state_dir = tmp_path / "cluster"
    cluster = DevCluster.start(state_dir)
    try:
        podsim = next(r for r in cluster._state.processes if r.name == "podsim")
        os.kill(podsim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while is_running(podsim) and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(
            DevClusterError, match=r"half running \(podsim down, .*apportion dev-cluster stop"
        ):
            DevCluster.start(state_dir)
        assert cluster.readyz() == "ok", "the running half was left alone"
    finally:
        cluster.stop()
    assert not state_dir.exists()


def test_the_pod_simulator_outlives_an_api_server_restart(tmp_path, wait_for) -> None:
    """The API server goes away (SIGKILL) and comes back on the same etcd: the simulator keeps
    its process pods running through the outage and serves new pods afterwards (it used to die
    on the first connection error, taking every process pod with it)."""
    cluster = DevCluster.start(tmp_path / "cluster")
    restarted: subprocess.Popen[bytes] | None = None
    try:
        cluster.kubectl("create", "namespace", "outage")
        sleeper = ["python", "-c", "import time; time.sleep(3600)"]
        cluster.kubectl("apply", "-f", "-", input=process_pod("outage", "before", sleeper))
        wait_for(ready_pods(cluster, "outage", "app=before", 1), message="a pod before")
        records = {r.name: r for r in cluster._state.processes}
        server, podsim = records["kube-apiserver"], records["podsim"]
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        os.kill(server.pid, signal.SIGKILL)
        podsim_log = cluster.log_path("podsim")
        wait_for(
            lambda: "failed" in podsim_log.read_text() or "interrupted" in podsim_log.read_text(),
            timeout=120,
            message="the simulator notices the API server is gone",
        )
        with cluster.log_path("kube-apiserver").open("ab") as log:
            restarted = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: _answers(cluster), timeout=120, message="the API server back")
        assert is_running(podsim), "the simulator outlived the outage"
        cluster.kubectl("apply", "-f", "-", input=process_pod("outage", "after", sleeper))
        wait_for(ready_pods(cluster, "outage", "app=after", 1), timeout=120, message="a pod after")
        (before,) = pods(cluster, "outage", "app=before")
        assert is_ready(before), "the process pod from before the outage still runs"
    finally:
        cluster.stop()
        if restarted is not None:
            restarted.kill()
            restarted.wait()


def _answers(cluster: DevCluster) -> bool:
    try:
        return cluster.readyz() == "ok"
    except OSError:
        return False


def test_restore_etcd_puts_the_backed_up_state_back_under_the_same_addresses(
    tmp_path: Path, wait_for
) -> None:
    """Kubernetes' etcd recovery procedure on the dev-cluster: after `restore_etcd`, what was
    written since the backup is gone, the control plane answers on the URLs clients already
    hold, the records (and the state file `attach` reads) name the restarted processes, and
    `stop` leaves none of the old or new processes behind."""
    state_dir = tmp_path / "cluster"
    cluster = DevCluster.start(state_dir)
    seen: list[ProcessRecord] = []
    try:
        cluster.kubectl("create", "namespace", "restored")
        cluster.kubectl("create", "configmap", "kept", "-n", "restored", "--from-literal=v=1")
        backup = cluster.backup_etcd(tmp_path / "backup")
        cluster.kubectl("patch", "configmap", "kept", "-n", "restored", "-p", '{"data":{"v":"2"}}')
        cluster.kubectl("create", "configmap", "later", "-n", "restored", "--from-literal=v=1")
        assert _data(cluster, "kept") == {"v": "2"}
        before = {r.name: r for r in cluster._state.processes}
        seen += before.values()

        started = time.monotonic()
        cluster.restore_etcd(backup)
        print(f"restore took {time.monotonic() - started:.1f}s")

        after = {r.name: r for r in cluster._state.processes}
        seen += after.values()
        assert _data(cluster, "kept") == {"v": "1"}
        gone = cluster.kubectl("get", "configmap", "later", "-n", "restored", check=False)
        assert gone.returncode != 0, gone.stdout
        assert "NotFound" in gone.stderr
        assert cluster.readyz() == "ok"
        assert cluster.process_status() == dict.fromkeys(before, True)
        for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
            assert after[name].pid != before[name].pid, name
            assert not is_running(before[name]), f"the old {name} still runs"
        assert after["podsim"] == before["podsim"], "the pod simulator ran through the restore"
        attached = DevCluster.attach(state_dir)
        assert {n: attached.pid(n) for n in after} == {n: r.pid for n, r in after.items()}
        assert all(attached.process_status().values())

        # A client that starts now (lists, then watches) sees a write made after the restore,
        # and the restarted controller-manager acts on it (the namespace's default account).
        with _watching(cluster, "configmaps", "-n", "restored") as lines:
            wait_for(lambda: "configmap/kept" in lines, message=lambda: f"no listing: {lines}")
            cluster.kubectl("create", "configmap", "after", "-n", "restored")
            wait_for(lambda: "configmap/after" in lines, message=lambda: f"no event: {lines}")
        cluster.kubectl("create", "namespace", "after-restore")
        wait_for(
            lambda: cluster.kubectl(
                "get", "serviceaccount", "default", "-n", "after-restore", check=False
            ).returncode == 0,
            message="the restarted controller-manager never created the default ServiceAccount",
        )  # fmt: skip
    finally:
        cluster.stop()
    left = [r for r in seen if is_running(r)]
    assert not left, f"still running after stop: {left}"
    assert not _processes_naming(state_dir), "a process still names the state directory"
    assert not state_dir.exists()


def _data(cluster: DevCluster, name: str) -> dict[str, str]:
    found = cluster.kubectl("get", "configmap", name, "-n", "restored", "-o", "json").stdout
    data: dict[str, str] = json.loads(found)["data"]
    return data


@contextlib.contextmanager
def _watching(cluster: DevCluster, *args: str) -> Iterator[list[str]]:
    """`kubectl get --watch -o name` running; the lines it printed so far, as they come."""
    argv = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "get", *args]
    watch = subprocess.Popen(
        [*argv, "--watch", "-o", "name"], stdout=subprocess.PIPE, text=True, env=cluster.env
    )
    lines: list[str] = []
    output = watch.stdout
    assert output is not None

    def read() -> None:
        for line in output:
            lines.append(line.strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield lines
    finally:
        watch.kill()
        watch.wait()
        reader.join(5)


def _processes_naming(path: Path) -> list[int]:
    """Pids whose command line names `path`: every component's does (data, certificates,
    kubeconfig or state directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(path).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
