"""Helpers of the PartitionSet/ShardSet end-to-end tests: the operator as a process, worker
StatefulSets, and reading back what the operator published (assignment ConfigMaps, status,
Events, worker logs)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from apportion.api.assignment import (
    AssignmentTable,
    ConfigMapPayload,
    assignment_config_map,
    chunk_suffixes,
    decode_assignment,
)
from apportion_dev.devcluster.net import free_port, http_get
from apportion_dev.devcluster.podsim.relay import CUT_ANNOTATION, CUT_CONDITION

REPO = Path(__file__).resolve().parents[2]
API = "apportion.dev/v1alpha1"
# The ServiceAccount every test namespace has for its workers, bound to the apportion-worker
# ClusterRole (conftest.namespace): worker processes run with exactly that role.
WORKER_ACCOUNT = "apportion-worker"


class Operator:
    """`apportion operator` watching one namespace, as a process logging to a file."""

    def __init__(
        self,
        dev_cluster: Any,
        namespace: str,
        log: Path,
        *,
        leader_election: str | None = None,
        lease_namespace: str | None = None,
        identity: str = "operator-0",
        kubeconfig: Path | None = None,
    ) -> None:
        """`lease_namespace`: where the leader-election Lease lives (default `namespace`);
        `kubeconfig`: the credentials to run with (default the cluster admin's)."""
        self.log = log
        self.identity = identity
        self.metrics_port = free_port()
        args = [sys.executable, "-m", "apportion", "operator", "--namespace", namespace]
        args += ["--metrics", f"127.0.0.1:{self.metrics_port}"]
        if leader_election:
            args += ["--leader-election", leader_election]
            args += ["--leader-election-namespace", lease_namespace or namespace]
        env = {**dev_cluster.env, "POD_NAME": identity}
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        self._out = log.open("w")
        self.process = subprocess.Popen(args, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: no cleanup, the Lease is not given up."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._out.close()
        return self.process.returncode

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        """The operator's /metrics exposition ("" while it does not answer)."""
        code, body = http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        return body if code == 200 else ""

    def samples_of(self, name: str) -> list[Any]:
        """Every sample called `name` on /metrics, as a scraper parses them."""
        return [
            sample
            for family in text_string_to_metric_families(self.metrics())
            for sample in family.samples
            if sample.name == name
        ]

    def samples(self, name: str) -> list[float]:
        """Values of every sample called `name` on /metrics."""
        return [sample.value for sample in self.samples_of(name)]


def apply(kubectl: Callable[..., Any], namespace: str, *objects: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))


def get(kubectl: Callable[..., Any], namespace: str, *what: str) -> dict[str, Any]:
    return json.loads(kubectl("get", "-n", namespace, *what, "-o", "json").stdout)


def workers(
    name: str,
    replicas: int,
    *,
    command: list[str] | None = None,
    grace: int = 10,
    labels: dict[str, str] | None = None,
    min_ready: int = 0,
) -> dict[str, Any]:
    """A StatefulSet of worker pods; with `command`, each pod runs it as a local process
    (pod simulator) under the namespace's WORKER_ACCOUNT, otherwise pods are simulated and
    never acknowledge anything. `min_ready`: seconds a rolling update waits after each new pod
    is Ready."""
    labels = labels or {"app": name}
    container: dict[str, Any] = {"name": "worker", "image": "apportion:test"}
    template_meta: dict[str, Any] = {"labels": labels}
    pod_spec: dict[str, Any] = {"terminationGracePeriodSeconds": grace, "containers": [container]}
    if command is not None:
        pod_spec["serviceAccountName"] = WORKER_ACCOUNT
        container["command"] = command
        container["ports"] = [{"name": "metrics", "containerPort": 8080}]
        template_meta["annotations"] = {"apportion.dev/simulate": "process"}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "minReadySeconds": min_ready,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": template_meta,
                "spec": pod_spec,
            },
        },
    }


def grant_worker_role(kubectl: Callable[..., Any], namespace: str) -> None:
    """The ServiceAccount WORKER_ACCOUNT in `namespace`, bound to the apportion-worker
    ClusterRole of manifests/worker-rbac.yaml, as a user grants their workers, under the
    ValidatingAdmissionPolicy of manifests/worker-policy.yaml that `kubectl apply -k manifests/`
    installs: every worker in the e2e suite runs with both."""
    kubectl("apply", "-f", str(REPO / "manifests" / "worker-rbac.yaml"))
    kubectl("apply", "-f", str(REPO / "manifests" / "worker-policy.yaml"))
    kubectl("create", "serviceaccount", WORKER_ACCOUNT, "-n", namespace)
    kubectl(
        "create",
        "rolebinding",
        WORKER_ACCOUNT,
        "-n",
        namespace,
        "--clusterrole=apportion-worker",
        f"--serviceaccount={namespace}:{WORKER_ACCOUNT}",
    )


def demo_worker(kind: str, set_name: str) -> list[str]:
    return ["apportion", "demo-worker", "--kind", kind, "--set", set_name, "--port", "8080"]


def worker_pid(namespace: str, pod: str, command: bytes = b"demo-worker") -> int:
    """The worker process the pod simulator runs for `pod` (found by its environment) whose
    command line holds `command`: the demo worker's, or a JVM's main class."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"POD_NAME={pod}".encode() in environ and (
            f"POD_NAMESPACE={namespace}".encode() in environ
        ):
            cmdline = (entry / "cmdline").read_bytes()
            if command in cmdline:
                return int(entry.name)
    raise LookupError(f"no demo worker process for {namespace}/{pod}")


def unit_set(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name}, "spec": spec}


def ready_pods(kubectl: Callable[..., Any], namespace: str, selector: str) -> list[dict]:
    pods = get(kubectl, namespace, "pods", "-l", selector)["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    ]


def read_table(
    kubectl: Callable[..., Any], namespace: str, kind: str, name: str
) -> AssignmentTable | None:
    """The published assignment, decoded as a worker would (None before the first write)."""
    base = assignment_config_map(kind, name)
    found = kubectl("get", "-n", namespace, "configmap", base, "-o", "json", check=False)
    if found.returncode != 0:
        return None
    root = ConfigMapPayload.from_configmap(json.loads(found.stdout), base)
    chunks = [
        ConfigMapPayload.from_configmap(get(kubectl, namespace, "configmap", base + s), base)
        for s in chunk_suffixes(root)
    ]
    return decode_assignment([root, *chunks])


def published(kubectl: Callable[..., Any], namespace: str, kind: str, name: str) -> AssignmentTable:
    """The published assignment of a set that has one (it was Balanced, or placed before)."""
    table = read_table(kubectl, namespace, kind, name)
    assert table is not None, f"{kind} {namespace}/{name} has no published assignment"
    return table


def counts(table: AssignmentTable) -> dict[str, int]:
    return {member: len(units) for member, units in table.by_member().items()}


def table(text: str) -> list[dict[str, str]]:
    """Rows of kubectl's table output; cells are cut at the header's column offsets because
    empty cells leave no token."""
    header, *rows = text.splitlines()
    names = header.split()
    starts = [header.index(f" {n} ") + 1 if i else 0 for i, n in enumerate(names[:-1])]
    starts.append(header.rindex(f" {names[-1]}") + 1)
    bounds = [*starts[1:], None]
    return [
        {n: row[a:b].strip() for n, a, b in zip(names, starts, bounds, strict=True)} for row in rows
    ]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


def is_true(obj: dict[str, Any], type_: str) -> bool:
    return condition(obj, type_).get("status") == "True"


def events(kubectl: Callable[..., Any], namespace: str, name: str) -> list[dict[str, Any]]:
    """Events regarding the set `name`, oldest first (events.k8s.io/v1)."""
    items = get(kubectl, namespace, "events.v1.events.k8s.io")["items"]
    mine = [e for e in items if (e.get("regarding") or {}).get("name") == name]
    return sorted(mine, key=lambda e: e.get("eventTime") or "")


def reasons(evs: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["reason"] for e in evs)


def note_number(event: dict[str, Any], pattern: str) -> int:
    """The number `pattern`'s first group finds in the event's note, which must have it."""
    found = re.search(pattern, event["note"])
    assert found, f"{pattern!r} not in the note {event['note']!r}"
    return int(found[1])


@dataclass(frozen=True)
class Ownership:
    """One line of a demo worker's log: `pod` started (acquire) or stopped (release, stop; split
    or merge: its state went into the new units) serving `unit` when it handled table `epoch`,
    at `time` (seconds); `token`: the unit's fencing token (its epoch in the table), None when
    the worker had none."""

    time: float
    pod: str
    action: str
    unit: str
    epoch: int
    token: int | None


# `apportion demo-worker` logs one line per unit: "<unix time> acquire unit=3 epoch=7 token=7
# pod=w-0 set=PartitionSet/demo count=32" (acquire, release, stop, split or merge).
_LOG_LINE = re.compile(
    r"^(?P<time>\d+\.\d+) (?P<action>acquire|release|stop|split|merge|suspend|resume) "
    r"unit=(?P<unit>\S+) "
    r"epoch=(?P<epoch>\d+) token=(?P<token>\S+) .*\bset=(?P<set>\S+)"
)


def ownership_log(
    dev_cluster: Any, namespace: str, pods: list[str], set_name: str
) -> list[Ownership]:
    """Every acquire/release/stop the given demo workers logged for the set (`Kind/name`), in
    time order."""
    lines: list[Ownership] = []
    for pod in pods:
        path = dev_cluster.pod_log_path(namespace, pod)
        if os.path.exists(path):
            lines += ownership_lines(Path(path).read_text(errors="replace"), pod, set_name)
    return sorted(lines, key=lambda o: o.time)


def ownership_lines(text: str, pod: str, set_name: str) -> list[Ownership]:
    """The ownership lines of one demo worker's log text (a pod log file, `kubectl logs`)."""
    found = []
    for line in text.splitlines():
        match = _LOG_LINE.search(line)
        if match and match["set"] == set_name:
            found.append(
                Ownership(
                    float(match["time"]),
                    pod,
                    match["action"],
                    match["unit"],
                    int(match["epoch"]),
                    int(match["token"]) if match["token"].isdigit() else None,
                )
            )
    return found


def serving(log: list[Ownership]) -> dict[str, str]:
    """Unit → the pod serving it at the end of the log (its last acquire or resume, with no
    release, stop or suspend of its own since)."""
    holder: dict[str, str] = {}
    for entry in log:
        if entry.action in ("acquire", "resume"):
            holder[entry.unit] = entry.pod
        elif holder.get(entry.unit) == entry.pod:
            del holder[entry.unit]
    return holder


def overlaps(log: list[Ownership]) -> list[str]:
    """Units that two pods served at the same time: an acquire (or a resume after the serving
    lease held again) while another pod still holds the unit (its release/stop/suspend comes
    later)."""
    holder: dict[str, Ownership] = {}
    found = []
    for entry in log:
        if entry.action in ("acquire", "resume"):
            other = holder.get(entry.unit)
            if other is not None and other.pod != entry.pod:
                found.append(
                    f"unit {entry.unit}: {entry.pod} acquired at epoch {entry.epoch} "
                    f"while {other.pod} held it since epoch {other.epoch}"
                )
            holder[entry.unit] = entry
        elif holder.get(entry.unit) is not None and holder[entry.unit].pod == entry.pod:
            del holder[entry.unit]
    return found


def overlap_spans(log: list[Ownership]) -> dict[str, float]:
    """Per unit that two pods served at once, for how many seconds in all (from the second
    pod's acquire or resume to the moment one of them logged it stopped); `math.inf` for an
    overlap the log never saw end."""
    serving: dict[str, set[str]] = {}
    since: dict[str, float] = {}
    spans: dict[str, float] = {}
    for entry in log:
        pods = serving.setdefault(entry.unit, set())
        if entry.action in ("acquire", "resume"):
            pods.add(entry.pod)
        else:
            pods.discard(entry.pod)
        if len(pods) > 1:
            since.setdefault(entry.unit, entry.time)
        elif entry.unit in since:
            start = since.pop(entry.unit)
            spans[entry.unit] = spans.get(entry.unit, 0.0) + entry.time - start
    for unit in since:
        spans[unit] = math.inf
    return spans


def cut_api_route(
    kubectl: Callable[..., Any], namespace: str, pod: str, cut: bool = True, timeout: float = 30
) -> None:
    """Cut (or restore) a relayed process pod's route to the API server (the pod simulator's
    relay, docs/dev-cluster.md), and return once the simulator says it is in effect: the
    annotation alone is only a request, which the simulator may act on after the operator has
    already acted on what came next."""
    flag = f"{CUT_ANNOTATION}=true" if cut else f"{CUT_ANNOTATION}-"
    kubectl("annotate", "pod", pod, "-n", namespace, flag)
    wanted = "True" if cut else "False"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conditions = get(kubectl, namespace, "pod", pod)["status"].get("conditions") or ()
        if any(c["type"] == CUT_CONDITION and c["status"] == wanted for c in conditions):
            return
        time.sleep(0.1)
    raise AssertionError(f"the simulator never reported {pod}'s API route cut={cut}")
