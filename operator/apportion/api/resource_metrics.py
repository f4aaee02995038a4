"""Resource figures in Kubernetes' own formats: quantities, `metrics.k8s.io/v1beta1` PodMetrics,
and the CPU and memory a Pod may use. Pure; the collector
(`apportion.controllers.load_collector`) does the reading.

    parse_quantity("12345n")                      # 1.2345e-05 (cores)
    pod_usage(pod_metrics_object).memory_bytes    # working set, summed over containers
    pod_resources(pod).cpu_capacity_cores         # limit, else request, else None
    container_ports(pod)["metrics"]               # a named port's number
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

# resource.Quantity's grammar (k8s.io/apimachinery/pkg/api/resource): a signed decimal, then a
# binary suffix, a decimal SI suffix or an exponent. "1E" is one exa, "1E3" is a thousand.
_QUANTITY_RE = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)"
)
_SUFFIXES: dict[str | None, Decimal] = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(value: str | int | float) -> float:
    """A Kubernetes quantity ("250m", "12345n", "1.5Gi", "1e3", 2) as a number of base units
    (cores, bytes). Raises ValueError for anything resource.Quantity would reject."""
    return _as_float(_quantity(value), value)


def _quantity(value: str | int | float) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{value!r} is not a quantity")
    text = str(value)
    found = _QUANTITY_RE.fullmatch(text)
    if not found:
        raise ValueError(f"{text!r} is not a quantity like '250m', '1.5Gi' or '1e3'")
    try:
        number = Decimal(found["number"])
        if found["exponent"]:
            number = number.scaleb(int(found["exponent"][1:]))
        return number * _SUFFIXES[found["suffix"]]
    except InvalidOperation as error:
        raise ValueError(f"{text!r} is out of range") from error


def _as_float(number: Decimal, what: object) -> float:
    """Sums stay in Decimal until here, so 100m + 200m + 50m is exactly 0.35."""
    result = float(number)
    if not math.isfinite(result):
        raise ValueError(f"{what!r} is out of range")
    return result


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """What a PodMetrics object says a pod uses, summed over its containers."""

    cpu_cores: float
    memory_bytes: int
    """Working set, the figure the kubelet evicts on."""
    timestamp: str
    """When the figures were taken (changes with every new sample)."""


def pod_usage(obj: Mapping[str, Any]) -> ResourceUsage:
    """Read a PodMetrics object (`containers[].usage.cpu/memory`, `timestamp`). Raises
    ValueError naming the container and figure that cannot be read."""
    cpus: list[Decimal] = []
    memories: list[Decimal] = []
    containers = obj.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ValueError("PodMetrics has no containers")
    for container in containers:
        usage = container.get("usage") if isinstance(container, Mapping) else None
        name = container.get("name", "?") if isinstance(container, Mapping) else "?"
        if not isinstance(usage, Mapping):
            raise ValueError(f"PodMetrics container {name!r} has no usage")
        try:
            cpus.append(_quantity(usage["cpu"]))
            memories.append(_quantity(usage["memory"]))
        except KeyError as missing:
            raise ValueError(f"PodMetrics container {name!r} has no usage {missing}") from None
        except ValueError as error:
            raise ValueError(f"PodMetrics container {name!r}: {error}") from None
    if min(cpus) < 0 or min(memories) < 0:
        raise ValueError("PodMetrics usage is negative")
    cpu = _as_float(sum(cpus, Decimal(0)), "PodMetrics cpu")
    memory = _as_float(sum(memories, Decimal(0)), "PodMetrics memory")
    return ResourceUsage(cpu, round(memory), str(obj.get("timestamp") or ""))


@dataclass(frozen=True, slots=True)
class PodResources:
    """What a pod may use, from its spec. None where any running container has no such value
    (the pod is then not bounded by it)."""

    cpu_limit_cores: float | None = None
    cpu_request_cores: float | None = None
    memory_limit_bytes: int | None = None

    @property
    def cpu_capacity_cores(self) -> float | None:
        """What CPU usage is a percentage of: the limit, else the request."""
        return self.cpu_limit_cores or self.cpu_request_cores or None


def _running_containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    # Sidecars (init containers with restartPolicy Always) run beside the app containers.
    sidecars = [c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"]
    return [*(spec.get("containers") or ()), *sidecars]


def _total(containers: list[Mapping[str, Any]], kind: str, resource: str) -> float | None:
    values = []
    for container in containers:
        value = ((container.get("resources") or {}).get(kind) or {}).get(resource)
        if value is None:
            return None
        values.append(_quantity(value))
    return _as_float(sum(values, Decimal(0)), f"{resource} {kind}") if values else None


def pod_resources(pod: Mapping[str, Any]) -> PodResources:
    """CPU limit and request and memory limit of a Pod: pod-level `spec.resources` when set
    (Kubernetes 1.34+), else the sum over its running containers. Raises ValueError for a
    malformed quantity."""
    spec = pod.get("spec") or {}
    pod_level = spec.get("resources") or {}
    containers = _running_containers(spec)

    def figure(kind: str, resource: str) -> float | None:
        value = (pod_level.get(kind) or {}).get(resource)
        return parse_quantity(value) if value is not None else _total(containers, kind, resource)

    memory = figure("limits", "memory")
    return PodResources(
        cpu_limit_cores=figure("limits", "cpu"),
        cpu_request_cores=figure("requests", "cpu"),
        memory_limit_bytes=None if memory is None else round(memory),
    )


def container_ports(pod: Mapping[str, Any]) -> dict[str, int]:
    """Named container ports of a Pod (all containers), for resolving a port given by name as
    Services and probes do."""
    return {
        port["name"]: int(port["containerPort"])
        for container in _running_containers(pod.get("spec") or {})
        for port in container.get("ports") or ()
        if port.get("name")
    }
