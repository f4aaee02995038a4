"""Pods as the set daemons see them: membership facts of the pods some set selects, kept by a
watch (`caches.SelectedCache`, no LIST per pass), and the selection of a set's members.

A daemon registers what it selects (`want`) and waits for the cache to hold it before its pass,
so it never plans with a partial view of its pods (which would look like dead owners).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apportion.api.common import LabelSelector
from apportion.api.pods import ACK_PREFIX, drain_requested, is_ready, revision_of
from apportion.controllers.caches import SelectedCache
from apportion.controllers.load_collector import PodRef
from apportion.engine.set_pass import PodView
from apportion.publishing.deletion_costs import DELETION_COST

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodFact:
    """What the operator needs of one pod; equal facts mean no change worth a pass."""

    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = False
    terminating: bool = False
    terminal: bool = False
    revision: str = ""
    created: str = ""
    acks: Mapping[str, str] = field(default_factory=dict)
    deletion_cost: str | None = None
    drained: bool = False
    """`apportion.dev/drain: "true"` (kubectl apportion drain): hand everything off."""
    ref: PodRef | None = None
    """What the metrics collector needs (IP, named ports, resources)."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodFact:
        meta = body.get("metadata", {})
        status = body.get("status") or {}
        labels = dict(meta.get("labels") or {})
        annotations = meta.get("annotations") or {}
        return cls(
            name=meta["name"],
            uid=meta["uid"],
            labels=labels,
            ready=is_ready(status),
            terminating=meta.get("deletionTimestamp") is not None,
            terminal=status.get("phase") in TERMINAL_PHASES,
            revision=revision_of(labels),
            created=meta.get("creationTimestamp") or "",
            acks={k: v for k, v in annotations.items() if k.startswith(ACK_PREFIX)},
            deletion_cost=annotations.get(DELETION_COST),
            drained=drain_requested(annotations),
            ref=PodRef.from_pod(body),
        )

    def view(self, ack_key: str) -> PodView:
        return PodView(
            name=self.name,
            uid=self.uid,
            labels=self.labels,
            ready=self.ready,
            terminating=self.terminating,
            revision=self.revision,
            ack=self.acks.get(ack_key),
            drained=self.drained,
        )


pod_cache: SelectedCache[PodFact] = SelectedCache("pods", "Pod", "", PodFact.from_body)
"""namespace → facts of the pods some daemon wants."""


def pods_of(index: Mapping[str, Iterable[PodFact]], namespace: str) -> list[PodFact]:
    """Every pod of `namespace` that exists and has not terminated, one per name (the newest
    incarnation)."""
    newest: dict[str, PodFact] = {}
    for pod in index.get(namespace, ()):
        if pod.terminal:
            continue
        other = newest.get(pod.name)
        if other is None or pod.created > other.created:
            newest[pod.name] = pod
    return list(newest.values())


def select(pods: Iterable[PodFact], *selectors: LabelSelector | None) -> list[PodFact]:
    """Pods matching every given selector (None selectors are skipped)."""
    active = [s for s in selectors if s is not None]
    return [pod for pod in pods if all(s.matches(pod.labels) for s in active)]
