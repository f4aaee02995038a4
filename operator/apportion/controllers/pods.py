"""Pods as the set loops see them: membership facts of the pods some set selects, kept by a
watch (`caches.SelectedCache`, no LIST per pass), and the selection of a set's members.

A loop registers what it selects (`want`) and waits for the cache to hold it before its pass,
so it never plans with a partial view of its pods (which would look like dead owners).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from lightkube import AsyncClient

from apportion.api.common import LabelSelector
from apportion.api.pods import WorkerPod
from apportion.controllers.caches import SelectedCache


def pod_cache(
    client: AsyncClient, notify: Callable[[str], None], scope: Sequence[str]
) -> SelectedCache[WorkerPod]:
    """namespace → the pods some set wants."""
    return SelectedCache("pods", "Pod", "", WorkerPod.from_body, client, notify, scope)


def pods_of(pods: Iterable[WorkerPod]) -> list[WorkerPod]:
    """The pods of `pods` that exist and have not terminated, one per name (the newest
    incarnation)."""
    newest: dict[str, WorkerPod] = {}
    for pod in pods:
        if pod.terminal:
            continue
        other = newest.get(pod.name)
        if other is None or pod.created > other.created:
            newest[pod.name] = pod
    return list(newest.values())


def select(pods: Iterable[WorkerPod], *selectors: LabelSelector | None) -> list[WorkerPod]:
    """Pods matching every given selector (None selectors are skipped)."""
    active = [s for s in selectors if s is not None]
    return [pod for pod in pods if all(s.matches(pod.labels) for s in active)]
