"""Status conditions as Kubernetes API conventions define them (metav1.Condition), and the pure
helper every controller uses to set one.

`lastTransitionTime` moves only when a condition's status changes, so `kubectl describe` tells
how long a set has been Ready or Degraded; reason, message and observedGeneration follow every
call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, StringConstraints

from apportion.api.common import ApiModel, list_map


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """Condition types apportion reports."""

    READY = "Ready"
    """The resource is reconciled: its placements are published for the observed generation."""
    BALANCED = "Balanced"
    """Load (or unit counts) across members is within the imbalance tolerance."""
    PROGRESSING = "Progressing"
    """Moves or hand-offs are under way."""
    DEGRADED = "Degraded"
    """Something needs attention (no members, metrics missing, hand-off timed out...)."""
    RESHARDING = "Resharding"
    """The unit count is changing: the published table's count is not yet the spec's."""
    RECONCILING = "Reconciling"
    """kstatus' abnormal-true condition: work is under way that ends by itself (placing, moves
    and hand-offs, a resharding, a fence, the wait for the first members or their metrics, a
    failed pass retried with back-off)."""
    STALLED = "Stalled"
    """kstatus' abnormal-true condition: no progress without a user's change (an invalid spec or
    strategy, no members, a missing workload, a hand-off that timed out, a grain type claimed
    twice)."""


class Condition(ApiModel):
    """One aspect of the resource's state, as metav1.Condition."""

    type: Annotated[
        str,
        StringConstraints(
            min_length=1,
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    ] = Field(
        description="Condition type: Ready, Reconciling, Stalled, Balanced, Progressing, Degraded "
        "or Resharding."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: Annotated[
        str,
        StringConstraints(
            min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
        ),
    ] = Field(description="Why the condition has this status, in CamelCase.")
    message: Annotated[str, StringConstraints(max_length=32768)] = Field(
        "", description="What happened, for a human."
    )
    last_transition_time: datetime = Field(
        description="When the status last changed (not the reason or message)."
    )
    observed_generation: int | None = Field(
        None, ge=0, description="The metadata.generation this condition was computed for."
    )


Conditions = Annotated[
    list[Condition],
    Field(
        default_factory=list,
        max_length=16,
        json_schema_extra=list_map("type"),
        description="Ready, Reconciling, Stalled, Balanced, Progressing, Degraded and "
        "Resharding, with reasons (docs/api.md, Conditions).",
    ),
]


def condition_time(seconds: float) -> datetime:
    """A transition time from the caller's clock (Unix seconds), at the second precision the API
    server stores metav1.Time with, so comparisons with what it returns are stable. The caller
    owns the clock; nothing here reads one."""
    return datetime.fromtimestamp(int(seconds), UTC)


def _as_condition(value: Condition | Mapping[str, Any]) -> Condition:
    return value if isinstance(value, Condition) else Condition.model_validate(value)


def find_condition(
    conditions: Iterable[Condition | Mapping[str, Any]] | None, type_: str
) -> Condition | None:
    for value in conditions or ():
        condition = _as_condition(value)
        if condition.type == type_:
            return condition
    return None


def is_true(conditions: Iterable[Condition | Mapping[str, Any]] | None, type_: str) -> bool:
    condition = find_condition(conditions, type_)
    return condition is not None and condition.status is ConditionStatus.TRUE


def set_condition(
    conditions: Iterable[Condition | Mapping[str, Any]] | None,
    *,
    type_: str,
    status: ConditionStatus | bool,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: datetime,
) -> list[Condition]:
    """Return `conditions` with `type_` set; the input is left untouched.

    Existing conditions keep their order and a new one is appended. `lastTransitionTime` is
    `now` for a new condition or a changed status, and kept otherwise.
    """
    if isinstance(status, bool):
        status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
    result: list[Condition] = []
    found = False
    for value in conditions or ():
        current = _as_condition(value)
        if current.type == type_:
            found = True
            changed = current.status != status
            current = current.model_copy(
                update={
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "observed_generation": observed_generation,
                    "last_transition_time": now if changed else current.last_transition_time,
                }
            )
        result.append(current)
    if not found:
        result.append(
            Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                observed_generation=observed_generation,
                last_transition_time=now,
            )
        )
    return result


Verdict = tuple[bool, str, str]
"""(status, reason, message) of one condition."""


def set_conditions(
    conditions: Iterable[Condition | Mapping[str, Any]] | None,
    verdicts: Iterable[tuple[str, Verdict]],
    *,
    observed_generation: int | None,
    now: datetime,
) -> list[Condition]:
    """`set_condition` for each (type, verdict), in order, as of one generation and one now."""
    result = [_as_condition(c) for c in conditions or ()]
    for type_, (status, reason, message) in verdicts:
        result = set_condition(
            result,
            type_=type_,
            status=status,
            reason=reason,
            message=message,
            observed_generation=observed_generation,
            now=now,
        )
    return result


def dump_conditions(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    """Conditions in their wire form, for a status patch."""
    return [c.to_json_dict() for c in conditions]
