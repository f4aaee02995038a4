"""The placement table a GrainType should have now, and the status that goes with it: pure
functions of the GrainType, its pods (from the pod cache) and their smoothed load (from the
metrics collector)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from apportion.api.conditions import (
    ConditionType,
    condition_time,
    dump_conditions,
    set_condition,
    set_conditions,
)
from apportion.api.graintype import DEFAULT_GRAIN_TYPE, GrainStrategyName, GrainType
from apportion.api.placement_table import (
    GrainTypeRef,
    PlacementTableDocument,
    TableMember,
    TableStats,
    configmap_name,
)
from apportion.api.pods import WorkerPod
from apportion.engine.grains import (
    LoadSheddingThresholds,
)

LOAD_AWARE = frozenset(
    {GrainStrategyName.ACTIVATION_COUNT_BASED, GrainStrategyName.RESOURCE_OPTIMIZED}
)


def is_compatible(pod: WorkerPod) -> bool:
    """A member that may take new activations: Ready, neither terminating nor finished."""
    return pod.ready and not pod.terminating and not pod.terminal


def is_default(graintype: GrainType) -> bool:
    return graintype.metadata.name == DEFAULT_GRAIN_TYPE


def member_stats(stats: TableStats, shedding: LoadSheddingThresholds) -> TableStats:
    """The published statistics of one member: the collector's smoothed figures (rounded, so
    the table does not carry noise digits), with the load-shedding thresholds applied to the
    overloaded flag so that readers need not know them."""
    return stats.model_copy(
        update={
            "cpu_usage": round(stats.cpu_usage, 2),
            "memory_usage": round(stats.memory_usage, 2),
            "overloaded": shedding.is_overloaded(stats),
        }
    )


def counted_grain_types(graintype: GrainType) -> list[str] | None:
    """Whose activations a member's count holds: the GrainType's own grain types; for the
    `default` GrainType every activation (None: Orleans' member-wide count)."""
    return None if is_default(graintype) else graintype.grain_type_names()


def build_document(
    graintype: GrainType,
    members: Iterable[WorkerPod],
    stats: Mapping[str, TableStats],
    *,
    version: int,
    now: datetime,
) -> PlacementTableDocument:
    """The table for `members` (compatible pods of the GrainType) and their smoothed
    statistics (members without any are published without `stats`)."""
    spec = graintype.spec
    shedding = LoadSheddingThresholds.from_dict(spec.load_shedding.model_dump(by_alias=True))
    meta = graintype.metadata
    table_members = []
    for pod in sorted(members, key=lambda p: p.name):
        figures = stats.get(pod.name)
        table_members.append(
            TableMember(
                name=pod.name,
                address=pod.ip,
                labels=dict(pod.labels),
                stats=None if figures is None else member_stats(figures, shedding),
            )
        )
    return PlacementTableDocument(
        grain_type=GrainTypeRef(
            namespace=meta.namespace or "",
            name=meta.name or "",
            uid=meta.uid or "",
            generation=meta.generation or 0,
        ),
        grain_types=graintype.grain_type_names(),
        default=is_default(graintype),
        version=version,
        published_at=now,
        strategy=spec.strategy,
        filters=list(spec.filters),
        load_shedding=spec.load_shedding,
        members=table_members,
    )


# ---------------------------------------------------------------------------------- status


@dataclass(frozen=True, slots=True)
class GrainTypeProblem:
    """Why a GrainType is Degraded (and, when `blocking`, not Ready)."""

    reason: str
    message: str
    blocking: bool = False


def problems(
    graintype: GrainType,
    selected: Sequence[WorkerPod],
    published: PlacementTableDocument | None,
    *,
    conflicts: Mapping[str, Sequence[str]] | None = None,
    error: str | None = None,
    metrics: str = "",
) -> list[GrainTypeProblem]:
    """What only the operator can judge, most serious first. `conflicts` maps each of this
    GrainType's grain types to the other GrainTypes of the namespace that claim it too;
    `error` is a failure to publish (the last good table stays); `metrics` is the collector's
    account of the load figures."""
    found: list[GrainTypeProblem] = []
    if error is not None:
        found.append(GrainTypeProblem("PublishFailed", error, blocking=True))
    members = published.members if published is not None else []
    if not selected:
        found.append(
            GrainTypeProblem(
                "NoMembers",
                f"no pod matches the selector {graintype.spec.selector.to_query()!r}",
                blocking=True,
            )
        )
    elif not members:
        found.append(
            GrainTypeProblem(
                "NoCompatibleMembers",
                f"{len(selected)} pods selected, none Ready: new activations cannot be placed",
                blocking=True,
            )
        )
    elif all(m.stats is not None and m.stats.overloaded for m in members):
        found.append(
            GrainTypeProblem(
                "AllMembersOverloaded",
                f"all {len(members)} compatible members are above a load-shedding threshold: "
                "load-aware strategies place nothing",
            )
        )
    elif graintype.spec.strategy.name in LOAD_AWARE and all(m.stats is None for m in members):
        found.append(
            GrainTypeProblem(
                "NoStatistics",
                f"no member has reported load yet; {graintype.spec.strategy.name} places at "
                f"random until one does ({metrics or 'check spec.metrics'})",
            )
        )
    clashes = {t: others for t, others in (conflicts or {}).items() if others}
    if clashes:
        text = "; ".join(
            f"{t!r} also claimed by {', '.join(o)}" for t, o in sorted(clashes.items())
        )
        found.append(
            GrainTypeProblem(
                "GrainTypeConflict",
                f"{text}: workers use the GrainType whose name sorts first",
            )
        )
    return found


def build_status(
    graintype: GrainType,
    selected: Sequence[WorkerPod],
    published: PlacementTableDocument | None,
    found: Sequence[GrainTypeProblem],
    *,
    conditions: Iterable[Mapping[str, Any]],
    now: datetime,
    last_publish_time: str | None,
) -> dict[str, Any]:
    """The status patch: counts, table reference and conditions (updated from `conditions`, the
    ones the object has)."""
    generation = graintype.metadata.generation
    members = published.members if published is not None else []
    blocking = next((p for p in found if p.blocking), None)
    if blocking is not None:
        ready = (False, blocking.reason, blocking.message)
    elif published is None:
        ready = (False, "Pending", "the placement table is not written yet")
    else:
        ready = (
            True,
            "Published",
            f"placement table version {published.version} with {len(members)} compatible members",
        )
    conditions = set_condition(
        conditions,
        type_=ConditionType.READY,
        status=ready[0],
        reason=ready[1],
        message=ready[2],
        observed_generation=generation,
        now=condition_time(now.timestamp()),
    )
    reconciling, stalled = kstatus_verdicts(found, published)
    worst = found[0] if found else None
    degraded = (
        worst is not None,
        worst.reason if worst else "AsExpected",
        "; ".join(p.message for p in found) if found else "",
    )
    conditions = set_conditions(
        conditions,
        (
            (ConditionType.RECONCILING, reconciling),
            (ConditionType.STALLED, stalled),
            (ConditionType.DEGRADED, degraded),
        ),
        observed_generation=generation,
        now=condition_time(now.timestamp()),
    )
    name = graintype.metadata.name or ""
    return {
        "observedGeneration": generation,
        "members": len(selected),
        "compatibleMembers": len(members),
        "overloadedMembers": len(published.overloaded_members()) if published else 0,
        "tableVersion": published.version if published else None,
        "placementTable": configmap_name(name) if published else None,
        "lastPublishTime": last_publish_time,
        "conditions": dump_conditions(conditions),
    }


STALLING = frozenset({"InvalidSpec", "NoMembers", "PublishFailed", "GrainTypeConflict"})
"""Problems that need a user's change (Stalled=True, kstatus Failed): a spec the operator
rejects, a selector nothing matches, a table too large for its ConfigMap, a grain type two
GrainTypes claim."""

_Verdict = tuple[bool, str, str]
_HELD = "nothing progresses until the spec or the cluster changes"
_FINE = "nothing waits for a change of the spec or the cluster"


def kstatus_verdicts(
    found: Sequence[GrainTypeProblem], published: PlacementTableDocument | None
) -> tuple[_Verdict, _Verdict]:
    """Reconciling and Stalled, kstatus' abnormal-true conditions (docs/api.md, "Status for
    GitOps tools"): never both True."""
    stalling = next((p for p in found if p.reason in STALLING), None)
    if stalling is not None:
        return (False, "Stalled", _HELD), (True, stalling.reason, stalling.message)
    stalled = (False, "AsExpected", _FINE)
    blocking = next((p for p in found if p.blocking), None)
    if blocking is not None:  # NoCompatibleMembers: the selected pods are not Ready yet
        return (True, blocking.reason, blocking.message), stalled
    if published is None:
        return (True, "Publishing", "the placement table is not written yet"), stalled
    return (
        False,
        "Settled",
        f"placement table version {published.version} is published",
    ), stalled


def blocked_status(
    generation: int | None,
    conditions: Iterable[Mapping[str, Any]],
    reason: str,
    message: str,
    *,
    now: datetime,
) -> dict[str, Any]:
    """Nothing new is published, the last table stands: a spec the API server accepted but the
    models reject (CRD/operator version skew; `InvalidSpec`, Stalled) or a pass that failed
    (`PassFailed`, retried with back-off: Reconciling)."""
    problem = GrainTypeProblem(reason, message, blocking=True)
    reconciling, stalled = kstatus_verdicts([problem], None)
    conditions = set_conditions(
        conditions,
        (
            (ConditionType.READY, (False, reason, message)),
            (ConditionType.RECONCILING, reconciling),
            (ConditionType.STALLED, stalled),
            (ConditionType.DEGRADED, (True, reason, message)),
        ),
        observed_generation=generation,
        now=condition_time(now.timestamp()),
    )
    return {"observedGeneration": generation, "conditions": dump_conditions(conditions)}


def invalid_status(
    generation: int | None,
    conditions: Iterable[Mapping[str, Any]],
    message: str,
    *,
    now: datetime,
) -> dict[str, Any]:
    """A spec the API server accepted but the models reject (CRD/operator version skew):
    nothing new is published, the last table stands."""
    return blocked_status(generation, conditions, "InvalidSpec", message, now=now)
