"""A worker pod as apportion sees it (`WorkerPod`): the one type for "a pod that may own units",
read off the Pod object by the operator's pod cache and the kubectl plugin, handed to the engine
as it is. Readiness, the revision a rollout compares, the drain annotation, every set's ack, and
what the load collector needs to scrape it.

`apportion.dev/drain: "true"` on a Pod (`kubectl apportion drain POD`) makes the operator treat
it as draining: it takes no new units and hands off those it holds through the normal,
acknowledged hand-off, while it keeps running. `kubectl apportion uncordon POD` removes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from apportion.api.resource_metrics import PodResources, container_ports, pod_resources

DRAIN_ANNOTATION: Final = "apportion.dev/drain"
ACK_PREFIX: Final = "apportion.dev/ack."
REVISION_LABELS: Final = ("controller-revision-hash", "pod-template-hash")
DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


def is_ready(status: Mapping[str, Any]) -> bool:
    return _ready_condition(status) is not None


def ready_since(status: Mapping[str, Any]) -> str:
    """When a Ready pod turned Ready (RFC 3339); empty when it is not Ready."""
    condition = _ready_condition(status)
    return "" if condition is None else str(condition.get("lastTransitionTime") or "")


def _ready_condition(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next(
        (
            c
            for c in status.get("conditions") or ()
            if c.get("type") == "Ready" and c.get("status") == "True"
        ),
        None,
    )


def revision_of(labels: Mapping[str, str]) -> str:
    return next((labels[k] for k in REVISION_LABELS if k in labels), "")


def drain_requested(annotations: Mapping[str, str]) -> bool:
    return annotations.get(DRAIN_ANNOTATION, "").strip().lower() == "true"


@dataclass(frozen=True, slots=True)
class WorkerPod:
    """One incarnation (`uid`) of a worker pod; equal values mean no change worth a pass.

    `terminating`: it has a deletionTimestamp. `drained`: `apportion.dev/drain: "true"` (kubectl
    apportion drain): like terminating, it takes nothing new and hands off what it holds, but it
    is still up and serving until then. `acks`: every set's ack annotation, by annotation key.
    `ip`, `ports` (named container ports) and `resources` are what the load collector scrapes
    and what usage is a percentage of.
    """

    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    ready_since: str = ""
    terminating: bool = False
    terminal: bool = False
    revision: str = ""
    created: str = ""
    acks: Mapping[str, str] = field(default_factory=dict)
    deletion_cost: str | None = None
    drained: bool = False
    ip: str | None = None
    ports: Mapping[str, int] = field(default_factory=dict)
    resources: PodResources = field(default_factory=PodResources)

    @property
    def draining(self) -> bool:
        """On its way out: it takes no new units and hands off those it holds."""
        return self.terminating or self.drained

    def ack(self, key: str) -> str | None:
        """The raw text of one set's ack annotation (`ack_annotation_key`), if written."""
        return self.acks.get(key)

    def for_set(self, key: str) -> WorkerPod:
        """The pod as one set's pass sees it: its ack under `key` only and no deletion cost (the
        operator's own write), so that another set's ack or a cost update is no change to it."""
        ack = self.acks.get(key)
        return replace(self, acks={} if ack is None else {key: ack}, deletion_cost=None)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> WorkerPod:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        labels = dict(meta.get("labels") or {})
        annotations = meta.get("annotations") or {}
        return cls(
            name=meta["name"],
            uid=meta.get("uid") or "",
            labels=labels,
            ready=is_ready(status),
            ready_since=ready_since(status),
            terminating=meta.get("deletionTimestamp") is not None,
            terminal=status.get("phase") in TERMINAL_PHASES,
            revision=revision_of(labels),
            created=meta.get("creationTimestamp") or "",
            acks={k: v for k, v in annotations.items() if k.startswith(ACK_PREFIX)},
            deletion_cost=annotations.get(DELETION_COST),
            drained=drain_requested(annotations),
            ip=status.get("podIP") or None,
            ports=container_ports(body),
            resources=pod_resources(body),
        )
