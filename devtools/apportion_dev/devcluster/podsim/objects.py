"""The API objects a kubelet would write, as plain dicts: Node, its Lease heartbeat, and Pod status.

Pure functions; the simulator decides when to send them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

SIM_NODE_LABEL = "apportion.dev/simulated-node"
SIMULATE_ANNOTATION = "apportion.dev/simulate"
ZONES = ("zone-a", "zone-b", "zone-c")
NODE_LEASE_NAMESPACE = "kube-node-lease"
NODE_LEASE_SECONDS = 40


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_name(index: int) -> str:
    return f"sim-node-{index}"


def node_manifest(index: int) -> dict[str, Any]:
    name = node_name(index)
    zone = ZONES[index % len(ZONES)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                SIM_NODE_LABEL: "true",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/region": "local",
                "topology.kubernetes.io/zone": zone,
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
    }


def node_status(
    address: str, name: str, kubelet_version: str, heartbeat: str, since: str
) -> dict[str, Any]:
    capacity = {"cpu": "32", "memory": "128Gi", "pods": "250", "ephemeral-storage": "500Gi"}
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "apportion pod simulator is posting ready status",
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": since,
    }
    pressure = [
        {
            "type": kind,
            "status": "False",
            "reason": f"KubeletHasSufficient{kind.removesuffix('Pressure')}",
            "message": "simulated",
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": since,
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    return {
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [*pressure, ready],
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": "simulated",
                "osImage": "apportion pod simulator",
                "containerRuntimeVersion": "sim://1",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
    }


def lease_manifest(node: str, renew_time: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": NODE_LEASE_NAMESPACE},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": NODE_LEASE_SECONDS,
            "renewTime": renew_time,
        },
    }


# --- scheduling -----------------------------------------------------------------------------


def _tolerates(pod: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    for toleration in pod.get("spec", {}).get("tolerations") or ():
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        if toleration.get("operator") == "Exists":
            if not toleration.get("key") or toleration["key"] == taint.get("key"):
                return True
        elif toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get(
            "value", ""
        ):
            return True
    return False


def fits(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """nodeSelector, cordoning and NoSchedule/NoExecute taints; affinity is not evaluated."""
    labels = node.get("metadata", {}).get("labels") or {}
    selector = pod.get("spec", {}).get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    if node.get("spec", {}).get("unschedulable"):
        return False
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in node.get("status", {}).get("conditions") or ()
    )
    if not ready:
        return False
    return all(
        _tolerates(pod, taint)
        for taint in node.get("spec", {}).get("taints") or ()
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def choose_node(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], load: Mapping[str, int]
) -> str | None:
    """The fitting node with the fewest pods, ties by name: replicas spread over zones."""
    candidates: list[str] = [n["metadata"]["name"] for n in nodes if fits(pod, n)]
    if not candidates:
        return None
    return min(candidates, key=lambda name: (load.get(name, 0), name))


# --- pod status -----------------------------------------------------------------------------


@dataclass
class ContainerView:
    """What the simulator knows about one container."""

    name: str
    image: str
    state: dict[str, Any]  # {"running": {...}} | {"waiting": {...}} | {"terminated": {...}}
    ready: bool = False
    restart_count: int = 0
    last_state: dict[str, Any] = field(default_factory=dict)
    container_id: str = ""

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": f"sim://{self.image}",
            "ready": self.ready,
            "started": "running" in self.state,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def running(started_at: str) -> dict[str, Any]:
    return {"running": {"startedAt": started_at}}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": message} if message else {"reason": reason}}


def terminated(exit_code: int, started_at: str, finished_at: str) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": started_at,
            "finishedAt": finished_at,
        }
    }


def _condition(
    previous: Mapping[str, Mapping[str, Any]], kind: str, ok: bool, now: str, reason: str = ""
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(kind)
    changed = before is None or before.get("status") != status
    condition = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": now if changed else before["lastTransitionTime"],  # type: ignore[index]
    }
    if reason and not ok:
        condition["reason"] = reason
    return condition


def pod_status(
    pod: Mapping[str, Any],
    *,
    phase: str,
    pod_ip: str,
    host_ip: str,
    start_time: str,
    containers: Sequence[ContainerView],
    now: str,
) -> dict[str, Any]:
    """A full `status` for a bound pod. Ready follows the containers and any readinessGates;
    lastTransitionTime moves only when a condition's status does."""
    previous = {c["type"]: c for c in pod.get("status", {}).get("conditions") or ()}
    all_ready = all(c.ready for c in containers) and phase == "Running"
    gates_ok = all(
        previous.get(g["conditionType"], {}).get("status") == "True"
        for g in pod.get("spec", {}).get("readinessGates") or ()
    )
    init_statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": f"sim://{c.get('image', '')}",
            "ready": True,
            "started": c.get("restartPolicy") == "Always",
            "restartCount": 0,
            "state": running(start_time)
            if c.get("restartPolicy") == "Always"
            else terminated(0, start_time, start_time),
        }
        for c in pod.get("spec", {}).get("initContainers") or ()
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "conditions": [
            _condition(previous, "PodReadyToStartContainers", True, now),
            _condition(previous, "Initialized", True, now),
            _condition(previous, "ContainersReady", all_ready, now, "ContainersNotReady"),
            _condition(
                previous,
                "Ready",
                all_ready and gates_ok,
                now,
                "ContainersNotReady" if not all_ready else "ReadinessGatesNotReady",
            ),
            _condition(previous, "PodScheduled", True, now),
        ],
        "containerStatuses": [c.to_status() for c in containers],
    }
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    return status


def unschedulable_status(pod: Mapping[str, Any], message: str, now: str) -> dict[str, Any]:
    previous = {c["type"]: c for c in pod.get("status", {}).get("conditions") or ()}
    condition = _condition(previous, "PodScheduled", False, now, "Unschedulable")
    condition["message"] = message
    return {"phase": "Pending", "conditions": [condition]}
