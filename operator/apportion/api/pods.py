"""What apportion reads off a worker Pod's object, shared by the operator's pod cache and the
kubectl plugin: readiness, the revision a rollout compares, and the drain annotation.

`apportion.dev/drain: "true"` on a Pod (`kubectl apportion drain POD`) makes the operator treat
it as draining: it takes no new units and hands off those it holds through the normal,
acknowledged hand-off, while it keeps running. `kubectl apportion uncordon POD` removes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

DRAIN_ANNOTATION: Final = "apportion.dev/drain"
ACK_PREFIX: Final = "apportion.dev/ack."
REVISION_LABELS: Final = ("controller-revision-hash", "pod-template-hash")


def is_ready(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )


def revision_of(labels: Mapping[str, str]) -> str:
    return next((labels[k] for k in REVISION_LABELS if k in labels), "")


def drain_requested(annotations: Mapping[str, str]) -> bool:
    return annotations.get(DRAIN_ANNOTATION, "").strip().lower() == "true"
