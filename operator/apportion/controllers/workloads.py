"""Deployments and StatefulSets as the set loops see them: their selectors (for `workloadRef`)
and whether they are rolling out a new revision, from a cache of the workloads some set refers
to (`caches.SelectedCache`, no GET per pass).

A rollout is under way when a StatefulSet's currentRevision differs from its updateRevision, a
Deployment still runs pods outside its newest ReplicaSet, or — with or without a workload — the
members carry more than one revision hash. Pods of other revisions than the newest are older:
they are about to be replaced, so strategies prefer the new ones.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from lightkube import AsyncClient
from pydantic import ValidationError

from apportion.api.common import LabelSelector, WorkloadKind
from apportion.api.pods import WorkerPod
from apportion.controllers.caches import SelectedCache
from apportion.engine.set_pass import Rollout


@dataclass(frozen=True)
class WorkloadFact:
    kind: str
    name: str
    selector: Mapping[str, Any] = field(default_factory=dict)
    replicas: int = 0
    status_replicas: int = 0
    updated_replicas: int = 0
    current_revision: str = ""
    update_revision: str = ""

    @classmethod
    def from_body(cls, kind: str, body: Mapping[str, Any]) -> WorkloadFact:
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        return cls(
            kind=kind,
            name=body["metadata"]["name"],
            selector=spec.get("selector") or {},
            replicas=spec.get("replicas", 1),
            status_replicas=status.get("replicas", 0),
            updated_replicas=status.get("updatedReplicas", 0),
            current_revision=status.get("currentRevision", ""),
            update_revision=status.get("updateRevision", ""),
        )

    def label_selector(self) -> LabelSelector | None:
        """The workload's pod selector; None if we cannot evaluate it, or it is empty (it
        would select every pod of the namespace)."""
        try:
            selector = LabelSelector.model_validate(self.selector)
        except ValidationError:
            return None
        return selector if selector.match_labels or selector.match_expressions else None


WorkloadCaches = Mapping[WorkloadKind, SelectedCache[WorkloadFact]]


def workload_caches(
    client: AsyncClient, notify: Callable[[str], None], scope: Sequence[str]
) -> WorkloadCaches:
    """Per kind: namespace → the workloads some set refers to (`Want.names`)."""
    return {
        kind: SelectedCache(
            plural,
            kind.value,
            "apps",
            partial(WorkloadFact.from_body, kind.value),
            client,
            notify,
            scope,
        )
        for kind, plural in (
            (WorkloadKind.STATEFUL_SET, "statefulsets"),
            (WorkloadKind.DEPLOYMENT, "deployments"),
        )
    }


def find_workload(
    caches: WorkloadCaches, namespace: str, kind: WorkloadKind, name: str
) -> WorkloadFact | None:
    return next((w for w in caches[kind].get(namespace, ()) if w.name == name), None)


def rollout_of(workload: WorkloadFact | None, members: Sequence[WorkerPod]) -> Rollout:
    """Whether a rollout is under way and which revision is the new one (see module doc)."""
    revisions = {pod.revision for pod in members if pod.revision}
    newest = max(members, key=lambda p: p.created).revision if members else ""
    if workload is not None and workload.kind == "StatefulSet" and workload.update_revision:
        new = workload.update_revision
        if workload.current_revision != new or revisions - {new}:
            updated = sum(1 for pod in members if pod.revision == new)
            return Rollout(
                True,
                new,
                f"StatefulSet {workload.name}: {updated} of {len(members)} member(s) "
                f"at revision {new}",
            )
        return Rollout(new_revision=new)
    if (
        workload is not None
        and workload.kind == "Deployment"
        and (workload.updated_replicas < workload.status_replicas or len(revisions) > 1)
    ):
        updated = sum(1 for pod in members if pod.revision == newest)
        return Rollout(
            True,
            newest or None,
            f"Deployment {workload.name}: {updated} of {len(members)} "
            f"member(s) at the newest pod template {newest}",
        )
    if len(revisions) > 1:
        updated = sum(1 for pod in members if pod.revision == newest)
        return Rollout(
            True,
            newest,
            f"members run {len(revisions)} revisions; {updated} at the newest, {newest}",
        )
    return Rollout()
