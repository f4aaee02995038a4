"""Pods as the set daemons see them: a kopf index of membership facts per namespace, kept by
the watch (no LIST per pass), and the selection of a set's members from it.

kopf fills every index from a full listing before any daemon runs, so a daemon never plans with
a partial view of the pods (which would look like dead owners).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import kopf
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from apportion.api.common import LabelSelector
from apportion.controllers.metrics import PodRef
from apportion.controllers.wakeups import wakeups
from apportion.engine.unitset import PodView
from apportion.publishing.pods import DELETION_COST

ACK_PREFIX = "apportion.dev/ack."
REVISION_LABELS = ("controller-revision-hash", "pod-template-hash")
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
    ref: PodRef | None = None
    """What the metrics collector needs (IP, named ports, resources)."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodFact:
        meta = body.get("metadata", {})
        status = body.get("status") or {}
        labels = dict(meta.get("labels") or {})
        annotations = meta.get("annotations") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or ()
        )
        return cls(
            name=meta["name"],
            uid=meta["uid"],
            labels=labels,
            ready=ready,
            terminating=meta.get("deletionTimestamp") is not None,
            terminal=status.get("phase") in TERMINAL_PHASES,
            revision=next((labels[k] for k in REVISION_LABELS if k in labels), ""),
            created=meta.get("creationTimestamp") or "",
            acks={k: v for k, v in annotations.items() if k.startswith(ACK_PREFIX)},
            deletion_cost=annotations.get(DELETION_COST),
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
        )


@kopf.index("", "v1", "pods")
def apportion_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[str, PodFact]:
    """namespace → facts of its pods."""
    return {namespace: PodFact.from_body(body)}


@kopf.on.event("", "v1", "pods")
async def pod_changed(namespace: str, **_: Any) -> None:
    # kopf runs event handlers after the indexes took the event in, so the woken daemons read
    # the new facts.
    await wakeups.notify(namespace)


def pods_of(
    index: Mapping[str, Iterable[PodFact]],
    namespace: str,
    ghosts: AbstractSet[str] = frozenset(),
) -> list[PodFact]:
    """Every pod of `namespace` that exists and has not terminated, one per name (the newest
    incarnation), without the `ghosts` (uids the API server no longer has)."""
    newest: dict[str, PodFact] = {}
    for pod in index.get(namespace, ()):
        if pod.terminal or pod.uid in ghosts:
            continue
        other = newest.get(pod.name)
        if other is None or pod.created > other.created:
            newest[pod.name] = pod
    return list(newest.values())


async def find_ghosts(client: AsyncClient, namespace: str, facts: Iterable[PodFact]) -> set[str]:
    """Uids of indexed pods the API server no longer has.

    kopf's indexes learn deletions from watch events only; a watch that restarts (the
    operator paused for a peer and resumed, or a 410 Gone re-list) re-lists what exists but
    never hears of what went meanwhile, so those pods would stay in the index and look alive.
    One LIST finds suspects; a GET by name confirms each (a pod created after the LIST is not
    one)."""
    listed = {pod.metadata.uid async for pod in client.list(Pod, namespace=namespace)}
    ghosts = set()
    for fact in facts:
        if fact.uid in listed:
            continue
        try:
            found = await client.get(Pod, fact.name, namespace=namespace)
        except ApiError as error:
            if error.status.code != 404:
                raise
            ghosts.add(fact.uid)
            continue
        if found.metadata.uid != fact.uid:
            ghosts.add(fact.uid)
    return ghosts


def select(pods: Iterable[PodFact], *selectors: LabelSelector | None) -> list[PodFact]:
    """Pods matching every given selector (None selectors are skipped)."""
    active = [s for s in selectors if s is not None]
    return [pod for pod in pods if all(s.matches(pod.labels) for s in active)]
