"""What PartitionSet and ShardSet share: a fixed number of numbered units (0..n-1) owned by worker
pods, a placement strategy, rebalancing with hand-off, and the status that reports it.

Each kind adds its unit count (`partitions` or `shards`) and its default key scheme.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from apportion.api.common import (
    GO_DURATION_RE,
    ApiModel,
    CustomStrategy,
    Decimal,
    Duration,
    IntOrPercent,
    LabelKey,
    LabelSelector,
    MetricsSpec,
    ObjectName,
    TopologySpread,
    WorkloadRef,
    cel,
    defaulted,
    list_map,
    max_duration,
    min_duration,
    parse_duration,
    strategy_option_rules,
    validations,
)
from apportion.api.conditions import Conditions
from apportion.api.resource import AGE_COLUMN, CrdInfo, PrinterColumn, condition_column

MAX_UNITS = 100_000
# Pins live in the spec, which kopf also keeps in its last-handled annotation (all annotations
# of an object share 256 KiB); 1024 pins stay far below that.
MAX_PINS = 1024
MAX_MEMBER_ROWS = 256


class KeySchemeName(StrEnum):
    """How a key (instance ID, entity ID) maps to a unit number."""

    NETHERITE = "netherite"
    """Text after the last `!` if it is an unsigned 32-bit integer n: n mod units; otherwise
    FNV-1a 32-bit over the UTF-8 bytes, mod units (Durable Functions Netherite)."""
    AKKA = "akka"
    """abs(Java String.hashCode(key) mod units) (Akka/Pekko Cluster Sharding)."""
    APPORTION = "apportion"
    """xxh3-64 of the UTF-8 bytes reduced by multiply-shift (unit u owns a contiguous hash range,
    so doubling the count splits each unit in two); a `!n` suffix pins as in netherite."""


class UnitStrategyName(StrEnum):
    """Which algorithm assigns units to members."""

    BALANCED = "Balanced"
    LEAST_SHARDS = "LeastShards"
    CONSISTENT_HASHING = "ConsistentHashing"
    EXTERNAL = "External"
    CUSTOM = "Custom"


class FallbackStrategyName(StrEnum):
    """Strategies that can place the units an External strategy leaves unpinned."""

    BALANCED = "Balanced"
    LEAST_SHARDS = "LeastShards"
    CONSISTENT_HASHING = "ConsistentHashing"


class BalancedOptions(ApiModel):
    """Options of Balanced: minimal-move rebalancing on measured load (unit counts when no load
    is reported), weighted by each member's capacity."""

    max_moved_load_percent: int = Field(
        10,
        ge=1,
        le=100,
        description="At most this percentage of the total load moves in one round.",
    )
    capacity_label: LabelKey | None = Field(
        None,
        description="Label on worker pods holding a positive number, the pod's relative capacity "
        "(default 1 for every pod).",
    )


class LeastShardsOptions(ApiModel):
    """Options of LeastShards, Akka's LeastShardAllocationStrategy: new units go to the member
    with the fewest; a round moves at most max(1, min(relativeLimit * units, absoluteLimit))."""

    absolute_limit: int = Field(
        20, ge=0, le=MAX_UNITS, description="Upper bound of units moved in one round."
    )
    relative_limit_percent: int = Field(
        10,
        ge=0,
        le=100,
        description="Upper bound of units moved in one round, as a percentage of all units "
        "(Akka's relative-limit 0.1 is 10).",
    )


class ConsistentHashingOptions(ApiModel):
    """Options of ConsistentHashing, Akka's ConsistentHashingShardAllocationStrategy: a hash
    ring with virtual nodes, so membership changes move few units."""

    virtual_nodes: int = Field(10, ge=1, le=1000, description="Points per member on the hash ring.")
    rebalance_limit: int = Field(
        0,
        ge=0,
        le=MAX_UNITS,
        description="Units moved in one round at most; 0 leaves only rebalance.maxMovesPerRound.",
    )


class Pin(ApiModel):
    """A unit placed on a named pod."""

    unit: int = Field(ge=0, lt=MAX_UNITS, description="Unit number, 0..units-1.")
    member: ObjectName = Field(description="Name of the worker pod that owns the unit.")


class ExternalOptions(ApiModel):
    """Options of External, Akka's ExternalShardAllocationStrategy: the user sets where units
    live; pins to absent pods and unpinned units are placed by the fallback strategy."""

    pins: list[Pin] = Field(
        min_length=1,
        max_length=MAX_PINS,
        json_schema_extra=list_map("unit"),
        description="Units pinned to pods, one entry per unit.",
    )
    fallback: FallbackStrategyName = Field(
        FallbackStrategyName.BALANCED,
        description="Strategy for unpinned units and pins whose pod is gone. Its options block "
        "(balanced, leastShards, consistentHashing) may be set too.",
    )


_OPTIONS: dict[UnitStrategyName, tuple[str, type[ApiModel]]] = {
    UnitStrategyName.BALANCED: ("balanced", BalancedOptions),
    UnitStrategyName.LEAST_SHARDS: ("least_shards", LeastShardsOptions),
    UnitStrategyName.CONSISTENT_HASHING: ("consistent_hashing", ConsistentHashingOptions),
    UnitStrategyName.EXTERNAL: ("external", ExternalOptions),
    UnitStrategyName.CUSTOM: ("custom", CustomStrategy),
}


class UnitStrategy(ApiModel):
    """The placement algorithm and its options; set only the options block of the chosen name."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.name != 'External' || has(self.external)",
                "strategy External needs strategy.external.pins (unit → pod name)",
                reason="FieldValueRequired",
            ),
            cel(
                "self.name != 'Custom' || has(self.custom)",
                "strategy Custom needs strategy.custom.entryPoint",
                reason="FieldValueRequired",
            ),
            *strategy_option_rules(
                {name: to_camel(field) for name, (field, _) in _OPTIONS.items()},
                also_allowed={
                    name: "self.name == 'External' && has(self.external) && "
                    f"self.external.fallback == '{name}'"
                    for name in FallbackStrategyName
                },
            ),
        )
    )

    name: UnitStrategyName = Field(
        UnitStrategyName.BALANCED,
        description="Balanced (default), LeastShards, ConsistentHashing, External or Custom.",
    )
    balanced: BalancedOptions | None = Field(None, description="Options of Balanced.")
    least_shards: LeastShardsOptions | None = Field(None, description="Options of LeastShards.")
    consistent_hashing: ConsistentHashingOptions | None = Field(
        None, description="Options of ConsistentHashing."
    )
    external: ExternalOptions | None = Field(None, description="Options of External.")
    custom: CustomStrategy | None = Field(
        None,
        description="Options of Custom: an entry point of `apportion.allocation_strategies`.",
    )

    def options(self, name: UnitStrategyName | None = None) -> Any:
        """Options of strategy `name` (default: the chosen one), with defaults when unset.

        External and Custom have no defaults; the API server guarantees them when chosen.
        """
        field, model = _OPTIONS[UnitStrategyName(name or self.name)]
        value = getattr(self, field)
        if value is None and model not in (ExternalOptions, CustomStrategy):
            return model()
        return value


IMBALANCE_TOLERANCES = {"Tight": 0.025, "Default": 0.10, "Loose": 0.40}
_TOLERANCE_RE = r"^(Tight|Default|Loose|(100|[1-9]?[0-9])(\.[0-9]+)?%)$"


def _check_tolerance(value: str) -> str:
    if not re.fullmatch(_TOLERANCE_RE, value):
        raise ValueError(f"{value!r} is not Tight, Default, Loose or a percentage like '5%'")
    return value


ImbalanceTolerance = Annotated[
    str,
    AfterValidator(_check_tolerance),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": 16,
            "x-kubernetes-validations": [
                cel(
                    f"self.matches(r'{_TOLERANCE_RE}')",
                    "must be Tight, Default, Loose or a percentage like '5%'",
                )
            ],
        }
    ),
]


class WhenCutOff(StrEnum):
    """What a worker does when it cannot confirm its view of the table (docs/handoff.md)."""

    STOP_SERVING = "StopServing"
    KEEP_SERVING = "KeepServing"


SERVING_LEASE_SHARE = 3
"""The serving lease defaults to handoffTimeout / 3: well inside the margin the inequality of
docs/handoff.md asks for (clock rates, the application's own stopping time)."""


class RebalancePolicy(ApiModel):
    """When and how much the operator moves units between live members."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.servingLease) || !has(self.handoffTimeout) "
                f"|| !self.servingLease.matches(r'{GO_DURATION_RE}') "
                f"|| !self.handoffTimeout.matches(r'{GO_DURATION_RE}') "
                "|| duration(self.servingLease).getMilliseconds() * 2 "
                "<= duration(self.handoffTimeout).getMilliseconds()",
                "servingLease must be at most half of handoffTimeout: a cut-off worker must stop "
                "serving well before its units may be given to another pod (docs/handoff.md)",
            )
        )
    )

    interval: Duration = Field(
        parse_duration("10s"),
        description="Time between rebalance rounds (Akka's rebalance-interval).",
        json_schema_extra=min_duration("rebalance.interval", "1s"),
    )
    max_moves_per_round: IntOrPercent = Field(
        "25%",
        description="Units moved in one round at most: a count, or a percentage of all units "
        "(rounded up). 0 stops rebalancing; units of pods that are gone always move at once.",
    )
    imbalance_tolerance: ImbalanceTolerance = Field(
        "Default",
        description="How far the most loaded member may exceed the best achievable before a "
        "round moves units: Tight (2.5%), Default (10%), Loose (40%) or a percentage like '5%'.",
    )
    pause_during_rollout: bool = Field(
        True,
        description="Hold rebalancing while the workload rolls out a new revision (units of "
        "pods that are gone still move).",
    )
    scale_up_wait: Duration = Field(
        parse_duration("30s"),
        description="How long moves onto the new pods of a scale-up wait for the workload's "
        "other missing replicas (workloadRef), so that the new pods are filled in one round "
        "instead of one round per pod turning Ready, which moves some units twice. Counted "
        "from when the first Ready pod that owns nothing yet turned Ready; units of pods that "
        "are gone still move at once. 0s: rebalance onto each pod as it turns Ready. At most "
        "10m.",
        json_schema_extra=max_duration("rebalance.scaleUpWait", "10m"),
    )
    handoff_timeout: Duration = Field(
        parse_duration("60s"),
        description="How long a releasing member has to acknowledge a hand-off before the unit "
        "is reassigned anyway (Akka's handoff-timeout).",
        json_schema_extra=min_duration("rebalance.handoffTimeout", "1s"),
    )
    restart_grace: Duration = Field(
        parse_duration("0s"),
        description="How long the units of a member that restarts in place wait for it instead "
        "of moving to a sibling and back: a container restart (the pod NotReady, same uid) or, "
        "with a StatefulSet workloadRef, a pod deleted and recreated under the same name, as a "
        "rolling update does (ordinals below replicas). Held units stay with the restarting "
        "pod, or are released by a deleted one to nobody and wait unowned, and return to it "
        "under a new token; after restartGrace they are placed as usual. 0s (the default) "
        "waits for nobody. At most 10m.",
        json_schema_extra=max_duration("rebalance.restartGrace", "10m"),
    )
    when_cut_off: WhenCutOff = Field(
        WhenCutOff.STOP_SERVING,
        description="What a worker that cannot confirm its view of the assignment (API server "
        "unreachable, its watch silent, its process paused) does once servingLease has passed: "
        "StopServing (the default: it serves nothing until it confirms again, so no unit is "
        "ever served by two pods, at the price of serving nothing during an API outage longer "
        "than the lease) or KeepServing (it goes on serving what it had; a pod cut off past "
        "handoffTimeout may then serve a unit beside its new owner, which only fenced storage "
        "writes, docs/fencing.md, make harmless).",
    )
    serving_lease: Duration | None = Field(
        None,
        description="How long a worker serves after its last confirmation of the assignment "
        "(StopServing). Default: handoffTimeout / 3; at most handoffTimeout / 2.",
        json_schema_extra=min_duration("rebalance.servingLease", "1s"),
    )

    def serving_lease_seconds(self) -> float | None:
        """The lease workers are held to (None: KeepServing, no lease)."""
        if self.when_cut_off is WhenCutOff.KEEP_SERVING:
            return None
        if self.serving_lease is not None:
            return self.serving_lease.total_seconds()
        return self.handoff_timeout.total_seconds() / SERVING_LEASE_SHARE

    def tolerance(self) -> float:
        """The imbalance tolerance as a fraction (0.1 for Default)."""
        value = self.imbalance_tolerance
        return IMBALANCE_TOLERANCES.get(value) or float(value.rstrip("%")) / 100


class StartupPolicy(ApiModel):
    """When the first placement may happen, so that it is balanced instead of putting every
    unit on the first pod that came up (Akka's min-nr-of-members)."""

    min_members: int | None = Field(
        None,
        ge=1,
        le=10000,
        description="Ready members the first placement waits for, however long it takes. "
        "Unset: the workload's replicas (workloadRef), for at most startup.timeout; without a "
        "workloadRef, the first ready member.",
    )
    timeout: Duration = Field(
        parse_duration("60s"),
        description="How long the first placement waits for the workload's replicas when "
        "minMembers is not set (from the set's creation).",
        json_schema_extra=min_duration("startup.timeout", "1s"),
    )


MAX_RESHARD_FACTOR = 64
"""Largest split or merge factor of one spec change: a split by 64 turns every unit into 64 in one
table; bigger jumps are a sign of a typo (and can still be made in two steps)."""


def unit_set_rules(count_field: str) -> dict[str, Any]:
    """Spec-level CEL rules of a unit set whose unit count is `count_field`.

    The count changes only with keyScheme apportion (a range scheme: unit u of n is the hash
    range [u·2⁶⁴/n, (u+1)·2⁶⁴/n), so a split or a merge by an integer factor moves no key to
    another parent); see docs/resharding.md. A count of 0 is the schema's to reject (minimum 1):
    the merge rule guards its modulus, so the API server's message names only that.
    """
    new, old = f"self.{count_field}", f"oldSelf.{count_field}"
    return validations(
        cel(
            f"{new} == {old} || (self.keyScheme == 'apportion' && "
            f"oldSelf.keyScheme == 'apportion')",
            f"{count_field} can only change with keyScheme apportion: netherite and akka "
            f"reduce a hash modulo the count, so changing it would move almost every key to "
            f"another unit (create a new set, or use keyScheme apportion from the start)",
            reason="FieldValueForbidden",
            field_path=f".{count_field}",
        ),
        cel(
            f"{new} == {old} || ({new} > {old} && {new} % {old} == 0 && "
            f"{new} / {old} <= {MAX_RESHARD_FACTOR}) || ({new} < {old} && {new} > 0 && "
            f"{old} % {new} == 0 "
            f"&& {old} / {new} <= {MAX_RESHARD_FACTOR})",
            f"{count_field} may only be multiplied (split) or divided (merge) by an integer "
            f"factor from 2 to {MAX_RESHARD_FACTOR}, e.g. 32 → 128 → 64: then every key "
            f"stays in the hash range of its old unit and nothing is reshuffled",
            field_path=f".{count_field}",
        ),
        cel(
            "has(self.selector) || has(self.workloadRef)",
            "spec.selector or spec.workloadRef is required: apportion needs to know which "
            "pods are the workers",
            reason="FieldValueRequired",
        ),
        cel(
            f"!has(self.strategy.external) || "
            f"self.strategy.external.pins.all(p, p.unit < self.{count_field})",
            f"every pinned unit must be below spec.{count_field} (units are numbered 0 to "
            f"{count_field} - 1)",
            field_path=".strategy.external.pins",
        ),
    )


class UnitSetSpec(ApiModel):
    """Fields common to PartitionSet and ShardSet specs."""

    if TYPE_CHECKING:  # each kind declares it, with its own default and description
        key_scheme: KeySchemeName

    selector: LabelSelector | None = Field(
        None,
        description="Labels of the worker pods. Required unless workloadRef is set; with both, "
        "members are the workload's pods that also match this selector.",
    )
    workload_ref: WorkloadRef | None = Field(
        None,
        description="The Deployment or StatefulSet running the workers: its selector finds "
        "members, and its rollouts pause rebalancing.",
    )
    strategy: UnitStrategy = defaulted(UnitStrategy, "How units are assigned to members.")
    metrics: MetricsSpec = defaulted(MetricsSpec, "Where load figures come from.")
    startup: StartupPolicy = defaulted(
        StartupPolicy, "When the first placement may happen (Akka's min-nr-of-members)."
    )
    rebalance: RebalancePolicy = defaulted(
        RebalancePolicy, "When and how much units move between live members."
    )
    topology_spread: TopologySpread | None = Field(
        None, description="Spread units evenly across a topology domain of the pods."
    )

    @property
    def units(self) -> int:
        """How many units the set has (partitions or shards)."""
        raise NotImplementedError


class MetricsSource(StrEnum):
    """What the latest placement was computed from."""

    COUNTS = "Counts"
    POD_METRICS = "PodMetrics"
    WORKER_LOAD = "WorkerLoad"
    POD_METRICS_AND_WORKER_LOAD = "PodMetricsAndWorkerLoad"


class MemberUnits(ApiModel):
    """How much one member holds."""

    member: ObjectName = Field(description="Worker pod name.")
    units: int = Field(ge=0, le=MAX_UNITS, description="Units the member owns.")
    load: Decimal | None = Field(None, description="Smoothed load of those units, if measured.")


class ReshardPhase(StrEnum):
    """Where a resharding stands (docs/resharding.md)."""

    SETTLING = "Settling"
    """Hand-offs under way finish or are cancelled, so that every parent has one owner."""
    GATHERING = "Gathering"
    """A merge moves sibling units onto one pod through normal hand-offs."""


class ReshardingStatus(ApiModel):
    """Progress of a change of the unit count."""

    from_count: int = Field(ge=1, le=MAX_UNITS, description="Count of the published table.")
    to_count: int = Field(ge=1, le=MAX_UNITS, description="Count asked for by the spec.")
    phase: ReshardPhase = Field(description="Settling or Gathering.")
    ready_units: int = Field(
        ge=0,
        le=MAX_UNITS,
        description="Units of the next table ready to be published: parents with one owner "
        "and no hand-off (split), gathered sibling groups (merge).",
    )
    total_units: int = Field(ge=0, le=MAX_UNITS, description="Units of the next table.")


class RestartHoldStatus(ApiModel):
    """Units held for a member that restarts in place (rebalance.restartGrace)."""

    pod: ObjectName = Field(description="The member: a pod name, whichever incarnation.")
    since: datetime = Field(description="When the operator saw it leave (NotReady or gone).")
    until: datetime = Field(description="When its units are placed as usual if it is not back.")
    units: str = Field(
        max_length=65536,
        description='The units held, as ranges of unit numbers: "0-7,12" (cut at 64 KiB).',
    )


class UnitSetStatus(ApiModel):
    """What the operator observed and published for a PartitionSet or ShardSet."""

    observed_generation: int = Field(
        0,
        ge=0,
        description=(
            "The metadata.generation this status reflects; 0 until the operator first saw the "
            "object, so that GitOps tools read a new object as in progress, not as current."
        ),
    )
    epoch: int | None = Field(
        None,
        ge=0,
        description="Epoch of the published assignment; grows with every change, never goes back.",
    )
    reserved_epoch: int | None = Field(
        None,
        ge=0,
        description="The highest epoch the operator may have written: it reserves each epoch "
        "here before writing its table, so a table lost or rolled back is republished above it and "
        "no epoch is ever used twice.",
    )
    fenced_until: datetime | None = Field(
        None,
        description="A table lost with no copy left was replaced by one where no pod owns "
        "anything; nothing is assigned before this time (one handoffTimeout later).",
    )
    members: int | None = Field(None, ge=0, description="Worker pods selected.")
    ready_members: int | None = Field(
        None, ge=0, description="Selected worker pods that are Ready and own units."
    )
    assigned_units: int | None = Field(
        None, ge=0, description="Units that have an owner in the published assignment."
    )
    assignment_config_map: ObjectName | None = Field(
        None, description="ConfigMap holding the assignment (owned by this resource)."
    )
    imbalance: Decimal | None = Field(
        None,
        description="Most loaded member's load over the mean (unit counts without metrics); 1.00 "
        "is perfect.",
    )
    moves_in_progress: int | None = Field(
        None, ge=0, description="Units being handed off between members."
    )
    releases_failing: int | None = Field(
        None,
        ge=0,
        description="Units being handed off whose owner reports its release callback failing "
        "(it retries; handoffTimeout reassigns them if it never succeeds).",
    )
    serving_suspensions: int | None = Field(
        None,
        ge=0,
        description="Times the members stopped serving because their serving lease ran out (the "
        "table could not be confirmed: API server out of reach, process paused), as their acks "
        "report once they serve again; counted per pod since it started.",
    )
    last_rebalance_time: datetime | None = Field(
        None, description="When units last moved between live members."
    )
    metrics_source: MetricsSource | None = Field(
        None, description="Load figures the last plan used: Counts when no metrics were found."
    )
    member_units: list[MemberUnits] = Field(
        default_factory=list,
        max_length=MAX_MEMBER_ROWS,
        json_schema_extra=list_map("member"),
        description=f"Units per member, most loaded first; at most {MAX_MEMBER_ROWS} rows (see "
        "`members` for the total).",
    )
    restart_holds: list[RestartHoldStatus] = Field(
        default_factory=list,
        max_length=MAX_MEMBER_ROWS,
        json_schema_extra=list_map("pod"),
        description="Members restarting in place whose units wait for them (rebalance."
        "restartGrace): nothing else may take those units before `until`.",
    )
    resharding: ReshardingStatus | None = Field(
        None,
        description="The resharding under way: the spec's unit count differs from the published "
        "table's; absent once the table with the new count is out.",
    )
    conditions: Conditions


def unit_set_crd(plural: str, short_names: tuple[str, ...], count_field: str) -> CrdInfo:
    """CRD metadata of a unit set: columns answer "is it healthy and balanced?" at a glance."""
    return CrdInfo(
        plural=plural,
        short_names=short_names,
        printer_columns=(
            condition_column("Ready"),
            condition_column("Balanced"),
            PrinterColumn("Members", ".status.members", "integer", "Worker pods selected."),
            PrinterColumn("Units", f".spec.{count_field}", "integer", f"Number of {count_field}."),
            PrinterColumn("Imbalance", ".status.imbalance", "string", "Max over mean load."),
            PrinterColumn("Moves", ".status.movesInProgress", "integer", "Hand-offs under way."),
            PrinterColumn("Epoch", ".status.epoch", "integer", "Assignment epoch."),
            AGE_COLUMN,
            PrinterColumn("Strategy", ".spec.strategy.name", priority=1),
            PrinterColumn("ConfigMap", ".status.assignmentConfigMap", priority=1),
            condition_column("Ready", "reason", name="Reason", priority=1),
        ),
    )
