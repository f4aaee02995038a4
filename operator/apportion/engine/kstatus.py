"""kstatus' two abnormal-true conditions, Reconciling and Stalled, for every kind the operator
reports on (docs/api.md, "Status for GitOps tools"): one verdict, so that a PartitionSet, a
ShardSet and a GrainType waiting for the same kind of thing look the same to Flux, Argo CD and
kubectl-style waiters. Pure: the kinds say what they are doing, this module says which of the two
conditions it makes True."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from apportion.api.conditions import Condition, ConditionType, Verdict, set_conditions

HELD = "nothing progresses until the spec or the cluster changes"
FINE = "nothing waits for a change of the spec or the cluster"

STALLING = frozenset(
    {
        "InvalidSpec",
        "InvalidStrategy",
        "NoMembers",
        "WorkloadNotFound",
        "HandoffTimedOut",
        "PublishFailed",
        "GrainTypeConflict",
    }
)
"""Problems that need a user's change (Stalled=True, kstatus Failed): a spec the operator
rejects, a strategy that cannot place, a selector or workload that matches nothing, a hand-off
forced by its timeout, a placement table too large for its ConfigMap, a grain type two GrainTypes
claim. Everything else that holds an object back ends by itself (Reconciling=True)."""

NOT_STALLED: Verdict = (False, "AsExpected", FINE)


class Reported(Protocol):
    """A problem as any kind reports it."""

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...


def verdicts(problems: Iterable[Reported], reconciling: Verdict) -> tuple[Verdict, Verdict]:
    """Reconciling and Stalled: never both True, Stalled first, since kstatus reads whichever
    comes first. The first stalling problem stalls the object; otherwise `reconciling` (what the
    kind is doing, or `(False, "Settled", …)`) stands and Stalled is False."""
    stalling = next((p for p in problems if p.reason in STALLING), None)
    if stalling is not None:
        return (False, "Stalled", HELD), (True, stalling.reason, stalling.message)
    return reconciling, NOT_STALLED


def blocked_conditions(
    previous: Iterable[Condition | Mapping[str, Any]],
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """The conditions of an object whose pass published nothing (the last table stands): a
    spec the operator rejects (`InvalidSpec`) needs a user's change, Stalled (kstatus Failed); a
    failed pass (`PassFailed`) is retried with back-off, Reconciling (kstatus InProgress)."""
    reconciling, stalled = verdicts([_Blocked(reason, message)], (True, reason, message))
    return set_conditions(
        previous,
        (
            (ConditionType.READY, (False, reason, message)),
            (ConditionType.RECONCILING, reconciling),
            (ConditionType.STALLED, stalled),
            (ConditionType.DEGRADED, (True, reason, message)),
        ),
        observed_generation=generation,
        now=now,
    )


class _Blocked:
    __slots__ = ("message", "reason")

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message


__all__ = ["FINE", "HELD", "NOT_STALLED", "STALLING", "blocked_conditions", "verdicts"]
