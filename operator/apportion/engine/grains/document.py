"""The placement table a GrainType should have now: a pure function of the GrainType, its pods
(from the operator's pod cache) and their smoothed load (from the metrics collector). Whether
and when it is written is `apportion.engine.grains.gate`'s to decide; the status that goes with
it, `apportion.engine.grains.status`'s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from apportion.api.graintype import DEFAULT_GRAIN_TYPE, GrainStrategyName, GrainType
from apportion.api.placement_table import (
    GrainTypeRef,
    PlacementTableDocument,
    TableMember,
    TableStats,
)
from apportion.api.pods import WorkerPod
from apportion.engine.grains.table import LoadSheddingThresholds

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
