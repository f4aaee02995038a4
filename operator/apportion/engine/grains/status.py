"""The status of a GrainType: what only the operator can judge is wrong with it (`problems`) and
the status patch that reports it with its placement table (`build_status`). Pure: the clock and
the conditions the object has come in as arguments."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from apportion.api.conditions import (
    ConditionType,
    Verdict,
    condition_time,
    dump_conditions,
    set_conditions,
)
from apportion.api.graintype import GrainType
from apportion.api.placement_table import PlacementTableDocument, configmap_name
from apportion.api.pods import WorkerPod
from apportion.engine.grains.document import LOAD_AWARE
from apportion.engine.kstatus import blocked_conditions, verdicts


@dataclass(frozen=True, slots=True)
class GrainTypeProblem:
    """Why a GrainType is Degraded (and, when `blocking`, not Ready)."""

    reason: str
    message: str
    blocking: bool = False


def claimed_grain_types(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The grain types a GrainType places, from its raw body: its `grainTypes`, or its own
    name (raw, so that another GrainType whose spec the models reject still counts)."""
    spec = body.get("spec") or {}
    return tuple(spec.get("grainTypes") or (body["metadata"]["name"],))


def conflicts(
    name: str, grain_types: Sequence[str], claims: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """Each of GrainType `name`'s grain types that other GrainTypes of its namespace claim
    too (`claims`: GrainType → its grain types), with those others by name."""
    found: dict[str, list[str]] = {}
    for grain_type in grain_types:
        others = sorted(o for o, names in claims.items() if o != name and grain_type in names)
        if others:
            found[grain_type] = others
    return found


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
    ready: Verdict
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
    reconciling, stalled = kstatus_verdicts(found, published)
    worst = found[0] if found else None
    degraded = (
        worst is not None,
        worst.reason if worst else "AsExpected",
        "; ".join(p.message for p in found) if found else "",
    )
    updated = set_conditions(
        conditions,
        (
            (ConditionType.READY, ready),
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
        "conditions": dump_conditions(updated),
    }


def kstatus_verdicts(
    found: Sequence[GrainTypeProblem], published: PlacementTableDocument | None
) -> tuple[Verdict, Verdict]:
    """Reconciling and Stalled (`apportion.engine.kstatus.verdicts`): a GrainType reconciles
    while its table is not written or no selected pod is Ready yet."""
    blocking = next((p for p in found if p.blocking), None)
    if blocking is not None:  # NoCompatibleMembers: the selected pods are not Ready yet
        reconciling: Verdict = (True, blocking.reason, blocking.message)
    elif published is None:
        reconciling = (True, "Publishing", "the placement table is not written yet")
    else:
        reconciling = (
            False,
            "Settled",
            f"placement table version {published.version} is published",
        )
    return verdicts(found, reconciling)


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
    blocked = blocked_conditions(
        conditions, reason, message, generation=generation, now=condition_time(now.timestamp())
    )
    return {"observedGeneration": generation, "conditions": dump_conditions(blocked)}


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
