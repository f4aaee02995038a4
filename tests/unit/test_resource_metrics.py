"""Kubernetes quantities, PodMetrics objects and pod resources, as the collector reads them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apportion.api.resource_metrics import (
    PodResources,
    ResourceUsage,
    container_ports,
    parse_quantity,
    pod_resources,
    pod_usage,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12345n", 12345e-9),  # metrics-server's CPU form
        ("250m", 0.25),
        ("100u", 1e-4),
        ("2", 2.0),
        (2, 2.0),
        (0.5, 0.5),
        ("1024Ki", 1024 * 1024),  # metrics-server's memory form
        ("1.5Gi", 1.5 * 2**30),
        ("966367641600m", 0.9 * 2**30),  # Kubernetes' canonical form of 0.9Gi
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("1.5e-3", 0.0015),
        ("1E", 1e18),  # E alone is exa
        ("2Ei", 2.0 * 2**60),
        ("1k", 1000.0),
        ("1M", 1e6),
        (".5", 0.5),
        ("5.", 5.0),
        ("+3", 3.0),
        ("-1", -1.0),
    ],
)
def test_quantities(text: str | int | float, expected: float) -> None:
    assert parse_quantity(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "text",
    ["", " 1", "1 ", "1e", "1K", "Ki", "1KiB", "1i", "abc", "1.2.3", "--1", "1e999999999", True],
)
def test_what_kubernetes_rejects_is_rejected(text: object) -> None:
    with pytest.raises(ValueError, match=r"is not a quantity|is out of range"):
        parse_quantity(text)  # type: ignore[arg-type]


BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


@settings(derandomize=True)
@given(st.integers(0, 10**6), st.sampled_from(sorted({**BINARY, **DECIMAL})))
def test_a_suffix_multiplies(number: int, suffix: str) -> None:
    factor = {**BINARY, **DECIMAL}[suffix]
    assert parse_quantity(f"{number}{suffix}") == pytest.approx(number * factor, rel=1e-12)


@settings(derandomize=True)
@given(st.integers(0, 10**9), st.integers(-9, 9), st.sampled_from("eE"))
def test_an_exponent_scales_by_powers_of_ten(number: int, exponent: int, e: str) -> None:
    assert parse_quantity(f"{number}{e}{exponent}") == pytest.approx(
        number * 10.0**exponent, rel=1e-12
    )


@settings(derandomize=True)
@given(st.integers(0, 2**40))
def test_binary_byte_counts_are_exact(kibibytes: int) -> None:
    assert parse_quantity(f"{kibibytes}Ki") == kibibytes * 1024


def metrics_object(*usages: dict[str, str], timestamp: str = "2025-01-01T00:00:00Z") -> dict:
    return {
        "apiVersion": "metrics.k8s.io/v1beta1",
        "kind": "PodMetrics",
        "metadata": {"name": "w-0", "namespace": "ns"},
        "timestamp": timestamp,
        "window": "10.5s",
        "containers": [{"name": f"c{i}", "usage": u} for i, u in enumerate(usages)],
    }


def test_pod_usage_sums_the_containers() -> None:
    usage = pod_usage(
        metrics_object({"cpu": "250000000n", "memory": "1024Ki"}, {"cpu": "5m", "memory": "1Mi"})
    )
    assert usage == ResourceUsage(0.255, 2 * 2**20, "2025-01-01T00:00:00Z")
    assert math.isclose(usage.cpu_cores, 0.255)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"containers": []}, "has no containers"),
        ({"containers": [{"name": "app"}]}, "container 'app' has no usage"),
        ({"containers": [{"name": "app", "usage": {"cpu": "1"}}]}, "has no usage 'memory'"),
        (
            {"containers": [{"name": "app", "usage": {"cpu": "lots", "memory": "1"}}]},
            "container 'app': 'lots' is not a quantity",
        ),
        ({"containers": [{"name": "app", "usage": {"cpu": "-1", "memory": "1"}}]}, "negative"),
    ],
)
def test_pod_usage_says_what_is_wrong(obj: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pod_usage(obj)


def pod(*containers: dict, pod_level: dict | None = None, init: list | None = None) -> dict:
    spec: dict = {"containers": list(containers)}
    if pod_level:
        spec["resources"] = pod_level
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": "w-0"}, "spec": spec}


def container(limits: dict | None = None, requests: dict | None = None, ports=()) -> dict:
    return {
        "name": "c",
        "resources": {"limits": limits or {}, "requests": requests or {}},
        "ports": list(ports),
    }


def test_pod_resources_sum_the_running_containers() -> None:
    resources = pod_resources(
        pod(
            container({"cpu": "500m", "memory": "256Mi"}, {"cpu": "100m"}),
            container({"cpu": "1", "memory": "1Gi"}, {"cpu": "200m"}),
            init=[
                {
                    **container({"cpu": "250m", "memory": "64Mi"}, {"cpu": "50m"}),
                    "restartPolicy": "Always",
                },
                container({"cpu": "8", "memory": "8Gi"}, {"cpu": "8"}),  # runs before, not beside
            ],
        )
    )
    assert resources == PodResources(1.75, 0.35, (256 + 1024 + 64) * 2**20)
    assert resources.cpu_capacity_cores == 1.75


def test_a_container_without_a_limit_leaves_the_pod_unbounded() -> None:
    resources = pod_resources(pod(container({"cpu": "1"}, {"cpu": "250m"}), container()))
    assert resources == PodResources(None, None, None)
    only_requests = pod_resources(pod(container(requests={"cpu": "250m"})))
    assert only_requests.cpu_capacity_cores == 0.25  # a percentage of the request then
    assert pod_resources({"spec": {}}) == PodResources()


def test_pod_level_resources_win() -> None:
    resources = pod_resources(
        pod(container({"cpu": "1", "memory": "1Gi"}), pod_level={"limits": {"cpu": "2"}})
    )
    assert resources == PodResources(2.0, None, 2**30)


def test_named_container_ports() -> None:
    p = pod(
        container(ports=[{"name": "http", "containerPort": 8080}]),
        container(ports=[{"name": "metrics", "containerPort": 9100}, {"containerPort": 7}]),
    )
    assert container_ports(p) == {"http": 8080, "metrics": 9100}
    assert container_ports({"spec": {}}) == {}
