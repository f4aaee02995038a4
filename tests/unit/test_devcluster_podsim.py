"""The pod simulator's pure parts: environment and command resolution, address pool, node choice
and pod status."""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apportion_dev.devcluster.podsim import objects
from apportion_dev.devcluster.podsim.ipam import IpPool
from apportion_dev.devcluster.podsim.podenv import (
    EnvError,
    command_line,
    container_env,
    expand,
    process_env,
    referenced_sources,
    source_data,
)
from apportion_dev.devcluster.podsim.process import exit_status

POD: dict[str, Any] = {
    "metadata": {
        "name": "w-0",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"role": "worker"},
        "annotations": {"team": "a"},
    },
    "spec": {"nodeName": "sim-node-1", "serviceAccountName": "default"},
}


def env_of(container: dict[str, Any], sources: dict | None = None) -> dict[str, str]:
    return container_env(
        POD, container, pod_ip="127.9.1.1", host_ip="127.9.0.2", sources=sources or {}
    )


def test_expansion_follows_kubernetes_rules() -> None:
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$(MISSING)", env) == "$(MISSING)"
    assert expand("$$(A) $$", env) == "$(A) $"
    assert expand("plain $A", env) == "plain $A"


def test_env_resolves_values_field_refs_and_earlier_variables() -> None:
    container = {
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {
                "name": "ROLE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}},
            },
            {
                "name": "TEAM",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['team']"}},
            },
            {"name": "ID", "value": "$(NAME).$(NS)"},
        ]
    }
    assert env_of(container) == {
        "NAME": "w-0",
        "NS": "ns",
        "IP": "127.9.1.1",
        "HOST": "127.9.0.2",
        "NODE": "sim-node-1",
        "ROLE": "worker",
        "TEAM": "a",
        "ID": "w-0.ns",
    }


def test_config_maps_and_secrets_feed_env_and_env_from() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {
                "name": "OPTIONAL",
                "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": True}},
            },
        ],
    }
    assert referenced_sources(container) == {
        ("ConfigMap", "cfg"),
        ("Secret", "s"),
        ("ConfigMap", "gone"),
    }
    secret = source_data("Secret", {"data": {"pw": base64.b64encode(b"hunter2").decode()}})
    sources = {("ConfigMap", "cfg"): {"mode": "fast"}, ("Secret", "s"): secret}
    assert env_of(container, sources) == {"CFG_mode": "fast", "PASSWORD": "hunter2", "OPTIONAL": ""}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"configMapKeyRef": {"name": "cfg", "key": "k"}}, 'configmap "cfg" not found'),
        ({"fieldRef": {"fieldPath": "spec.bogus"}}, "unsupported fieldRef"),
        ({"resourceFieldRef": {"resource": "limits.cpu"}}, "unsupported valueFrom"),
    ],
)
def test_unresolvable_env_is_a_config_error(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(EnvError, match=message):
        env_of({"env": [{"name": "X", "valueFrom": entry}]})


def test_command_and_args_are_expanded_and_required() -> None:
    container = {"name": "c", "command": ["run", "$(WHO)"], "args": ["--x=$(WHO)", "$$(WHO)"]}
    assert command_line(container, {"WHO": "me"}) == ["run", "me", "--x=me", "$(WHO)"]
    with pytest.raises(EnvError, match="no command"):
        command_line({"name": "c", "args": ["x"]}, {})


def test_process_env_layers_host_pod_and_container() -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    env = process_env(
        base,
        {"MODE": "x", "POD_IP": "override"},
        pod=POD,
        pod_ip="127.9.1.1",
        kubeconfig="/s/kubeconfig",
        path_prefix="/venv/bin",
    )
    assert env["PATH"] == "/venv/bin:/usr/bin"
    assert "KUBERNETES_SERVICE_HOST" not in env  # clients must not take the in-cluster path
    assert env["POD_NAME"] == "w-0"
    assert env["POD_NAMESPACE"] == "ns"
    assert env["KUBECONFIG"] == "/s/kubeconfig"
    assert env["POD_IP"] == "override"  # what the container declares wins
    assert env["HOME"] == "/root"


def test_a_pod_without_a_token_gets_no_credentials_not_even_the_simulators() -> None:
    base = {"PATH": "/usr/bin", "KUBECONFIG": "/admin/kubeconfig"}
    env = process_env(base, {}, pod=POD, pod_ip="127.9.1.1", kubeconfig=None, path_prefix="/b")
    assert "KUBECONFIG" not in env


def test_exit_status_reports_signals_as_128_plus_n() -> None:
    assert exit_status(0) == 0
    assert exit_status(3) == 3
    assert exit_status(-15) == 143


def test_pool_hands_out_unique_loopback_addresses_round_robin() -> None:
    pool = IpPool("127.42")
    first = pool.allocate("a")
    second = pool.allocate("b")
    assert first != second
    assert pool.node_ip(0) == "127.42.0.1"
    for address in (first, second):
        ip = ipaddress.ip_address(address)
        assert ip in ipaddress.ip_network("127.42.1.0/24")
    pool.release(first)
    assert pool.allocate("c") not in (first, second)  # not reused at once
    with pytest.raises(ValueError, match="loopback"):
        IpPool("10.1")


@given(st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=50)), max_size=300))
def test_pool_never_hands_out_an_address_in_use(operations: list[tuple[bool, int]]) -> None:
    pool = IpPool("127.43")
    live: dict[str, str] = {}
    for allocate, n in operations:
        if allocate or not live:
            address = pool.allocate(f"p{n}")
            assert address not in live.values()
            assert not address.endswith((".0", ".255"))
            live[f"{n}-{len(live)}-{address}"] = address
        else:
            key = sorted(live)[n % len(live)]
            pool.release(live.pop(key))


def node(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_nodes_are_chosen_by_fit_then_least_load() -> None:
    nodes = [
        node("sim-node-0", {"zone": "a"}),
        node("sim-node-1", {"zone": "b"}),
        node("sim-node-2", {"zone": "c"}, unschedulable=True),
    ]
    pod: dict[str, Any] = {"spec": {}}
    assert objects.choose_node(pod, nodes, {}) == "sim-node-0"
    assert objects.choose_node(pod, nodes, {"sim-node-0": 1}) == "sim-node-1"
    assert (
        objects.choose_node({"spec": {"nodeSelector": {"zone": "a"}}}, nodes, {"sim-node-0": 9})
        == "sim-node-0"
    )
    assert objects.choose_node({"spec": {"nodeSelector": {"zone": "c"}}}, nodes, {}) is None


def test_taints_need_tolerations() -> None:
    tainted = node("n", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}])
    assert not objects.fits({"spec": {}}, tainted)
    equal = {"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}
    assert objects.fits({"spec": {"tolerations": [equal]}}, tainted)
    assert objects.fits({"spec": {"tolerations": [{"operator": "Exists"}]}}, tainted)
    wrong = {**equal, "value": "web"}
    assert not objects.fits({"spec": {"tolerations": [wrong]}}, tainted)
    prefer = node("p", taints=[{"key": "k", "effect": "PreferNoSchedule"}])
    assert objects.fits({"spec": {}}, prefer)


def test_pod_status_is_ready_when_containers_and_gates_are() -> None:
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "c"}]}, "status": {}}
    ready = objects.ContainerView("c", "img", objects.running("t0"), ready=True)
    status = objects.pod_status(
        pod,
        phase="Running",
        pod_ip="127.1.1.1",
        host_ip="127.1.0.1",
        start_time="t0",
        containers=[ready],
        now="t1",
    )
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True"
    assert status["podIP"] == "127.1.1.1"
    assert status["containerStatuses"][0]["started"] is True

    pod["status"] = status
    not_ready = objects.ContainerView("c", "img", objects.waiting("CrashLoopBackOff"), ready=False)
    later = objects.pod_status(
        pod,
        phase="Running",
        pod_ip="127.1.1.1",
        host_ip="127.1.0.1",
        start_time="t0",
        containers=[not_ready],
        now="t2",
    )
    conditions = {c["type"]: c for c in later["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["lastTransitionTime"] == "t2"
    assert (
        conditions["PodScheduled"]["lastTransitionTime"] == "t1"
    )  # unchanged status keeps its time

    gated = {"spec": {"readinessGates": [{"conditionType": "example.com/gate"}]}, "status": {}}
    status = objects.pod_status(
        gated,
        phase="Running",
        pod_ip="i",
        host_ip="h",
        start_time="t0",
        containers=[ready],
        now="t3",
    )
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "False"
