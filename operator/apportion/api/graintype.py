"""GrainType: Orleans-style placement for virtual actors (grains).

A GrainType names a placement strategy, its options and filters for one or more grain types. The
operator publishes a placement table (compatible members, their labels and smoothed load) that
the worker library uses to place each new activation in-process.

Default strategy: the GrainType named `default` in a namespace applies to every grain type of
that namespace without a GrainType of its own (Orleans' default placement strategy); like any
GrainType without `strategy`, it uses ResourceOptimized with its default weights (Orleans'
default since 9.2). Without one, such grain types cannot be placed (`NoPlacementTable`).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from apportion.api.common import (
    LIST_SET,
    ApiModel,
    CustomStrategy,
    Duration,
    LabelKey,
    LabelSelector,
    LabelValue,
    MetricsSpec,
    ObjectName,
    cel,
    defaulted,
    min_duration,
    parse_duration,
    strategy_option_rules,
    validations,
)
from apportion.api.conditions import Conditions
from apportion.api.resource import AGE_COLUMN, CrdInfo, PrinterColumn, Resource, condition_column

DEFAULT_GRAIN_TYPE = "default"
DEFAULT_ROLE_LABEL = "apportion.dev/role"


class GrainStrategyName(StrEnum):
    """Orleans' placement strategies, a consistent-hash variant, and plug-ins."""

    RANDOM = "Random"
    PREFER_LOCAL = "PreferLocal"
    HASH_BASED = "HashBased"
    CONSISTENT_HASH_BASED = "ConsistentHashBased"
    ACTIVATION_COUNT_BASED = "ActivationCountBased"
    STATELESS_WORKER = "StatelessWorker"
    SILO_ROLE_BASED = "SiloRoleBased"
    RESOURCE_OPTIMIZED = "ResourceOptimized"
    CUSTOM = "Custom"


class ActivationCountOptions(ApiModel):
    """Options of ActivationCountBased: the least loaded of `chooseOutOf` random members (power
    of two choices), counting the caller's own recent placements."""

    choose_out_of: int = Field(
        2, ge=2, le=64, description="Members sampled per placement (Orleans' ChooseOutOf)."
    )


class StatelessWorkerOptions(ApiModel):
    """Options of StatelessWorker: activations always local, several per member."""

    max_local: int | None = Field(
        None,
        ge=1,
        le=100000,
        description="Activations per member at most (Orleans' MaxLocal); default: the worker's "
        "processor count.",
    )


class SiloRoleOptions(ApiModel):
    """Options of SiloRoleBased: a random member whose role label matches."""

    role_label: LabelKey = Field(
        DEFAULT_ROLE_LABEL, description="Pod label holding the member's role."
    )
    role: LabelValue | None = Field(
        None,
        description="Role the grain must run on; when unset, the grain's key is the role name "
        "(Orleans).",
    )


class ConsistentHashOptions(ApiModel):
    """Options of ConsistentHashBased: a hash ring over compatible members, so membership changes
    move few grains (HashBased is mod-n and moves most)."""

    virtual_nodes: int = Field(100, ge=1, le=1000, description="Points per member on the ring.")


def _weight(default: int, what: str) -> Any:
    return Field(default, ge=0, le=100, description=f"Relative weight of {what} (0-100).")


class ResourceOptimizedOptions(ApiModel):
    """Options of ResourceOptimized (Orleans 9.2+): the lowest weighted score of smoothed CPU,
    memory and activation count among ⌈√n⌉ sampled members, keeping the local member when it is
    within the preference margin; with optimistic accounting (ours) between tables."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.cpuUsage + self.memoryUsage + self.availableMemory + "
                "self.maxAvailableMemory + self.activationCount > 0",
                "at least one ResourceOptimized weight must be above 0",
            )
        )
    )

    cpu_usage: int = _weight(40, "CPU usage")
    memory_usage: int = _weight(20, "memory usage")
    available_memory: int = _weight(20, "available memory")
    max_available_memory: int = _weight(5, "maximum available memory")
    activation_count: int = _weight(15, "activation count")
    local_silo_preference_margin: int = Field(
        5,
        ge=0,
        le=100,
        description="Keep the local member when its score is within this margin of the best: 0 "
        "always picks the least loaded, 100 behaves as PreferLocal.",
    )
    optimistic_accounting: bool = Field(
        True,
        description="Count each placement into the chosen member's estimated activation count, "
        "CPU and memory until the next placement table (against herding on stale statistics); "
        "false scores the published statistics only, exactly as Orleans.",
    )


_OPTIONS: dict[GrainStrategyName, tuple[str, type[ApiModel]]] = {
    GrainStrategyName.ACTIVATION_COUNT_BASED: ("activation_count_based", ActivationCountOptions),
    GrainStrategyName.STATELESS_WORKER: ("stateless_worker", StatelessWorkerOptions),
    GrainStrategyName.SILO_ROLE_BASED: ("silo_role_based", SiloRoleOptions),
    GrainStrategyName.RESOURCE_OPTIMIZED: ("resource_optimized", ResourceOptimizedOptions),
    GrainStrategyName.CONSISTENT_HASH_BASED: ("consistent_hash_based", ConsistentHashOptions),
    GrainStrategyName.CUSTOM: ("custom", CustomStrategy),
}


class GrainStrategySpec(ApiModel):
    """The placement strategy and its options; set only the options block of the chosen name."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.name != 'Custom' || has(self.custom)",
                "strategy Custom needs strategy.custom.entryPoint",
                reason="FieldValueRequired",
            ),
            *strategy_option_rules({name: to_camel(f) for name, (f, _) in _OPTIONS.items()}),
        )
    )

    name: GrainStrategyName = Field(
        GrainStrategyName.RESOURCE_OPTIMIZED,
        description="Random, PreferLocal, HashBased, ConsistentHashBased, ActivationCountBased, "
        "StatelessWorker, SiloRoleBased, ResourceOptimized (default) or Custom.",
    )
    activation_count_based: ActivationCountOptions | None = Field(
        None, description="Options of ActivationCountBased."
    )
    stateless_worker: StatelessWorkerOptions | None = Field(
        None, description="Options of StatelessWorker."
    )
    silo_role_based: SiloRoleOptions | None = Field(None, description="Options of SiloRoleBased.")
    resource_optimized: ResourceOptimizedOptions | None = Field(
        None, description="Options of ResourceOptimized."
    )
    consistent_hash_based: ConsistentHashOptions | None = Field(
        None, description="Options of ConsistentHashBased."
    )
    custom: CustomStrategy | None = Field(
        None, description="Options of Custom: an entry point of `apportion.grain_strategies`."
    )

    def options(self) -> Any:
        """Options of the chosen strategy, with defaults when unset; None for strategies without
        options."""
        if self.name not in _OPTIONS:
            return None
        field, model = _OPTIONS[self.name]
        value = getattr(self, field)
        return model() if value is None and model is not CustomStrategy else value


class FilterType(StrEnum):
    """Orleans' placement filters on member metadata (pod labels)."""

    REQUIRED_MATCH = "RequiredMatch"
    """Keep members whose values equal the caller's on every key; none left fails."""
    PREFERRED_MATCH = "PreferredMatch"
    """Prefer members matching on every key; drop the earliest keys until at least
    minCandidates remain."""


class PlacementFilter(ApiModel):
    """A filter on candidate members, applied before the strategy."""

    type: FilterType = Field(description="RequiredMatch or PreferredMatch.")
    keys: list[LabelKey] = Field(
        min_length=1,
        max_length=8,
        json_schema_extra=LIST_SET,
        description="Pod label keys compared with the calling member's labels, most general "
        "first (PreferredMatch drops keys from the front).",
    )
    min_candidates: int = Field(
        2,
        ge=1,
        le=1000,
        description="PreferredMatch only: fewest candidates to keep before dropping a key.",
    )


class LoadShedding(ApiModel):
    """Overloaded members receive no new activations."""

    enabled: bool = Field(True, description="Exclude overloaded members from placement.")
    cpu_threshold: int = Field(
        95, ge=1, le=100, description="CPU usage percentage above which a member is overloaded."
    )
    memory_threshold: int = Field(
        90, ge=1, le=100, description="Memory usage percentage above which a member is overloaded."
    )


class PublishPolicy(ApiModel):
    """How often the placement table is written. Membership changes are published at once."""

    interval: Duration = Field(
        parse_duration("1s"),
        description="How often load figures are evaluated for publishing (Orleans' load "
        "publisher period).",
        json_schema_extra=min_duration("publish.interval", "100ms"),
    )
    min_interval: Duration = Field(
        parse_duration("2s"),
        description="Load-only updates are written at most this often.",
        json_schema_extra=min_duration("publish.minInterval", "100ms"),
    )
    hysteresis_percent: int = Field(
        5,
        ge=0,
        le=100,
        description="A load figure must move by more than this percentage (of its range for CPU "
        "and memory, relative for activation counts) before a load-only update is written.",
    )


GrainTypeName = Annotated[str, StringConstraints(min_length=1, max_length=512)]


class GrainTypeSpec(ApiModel):
    """Desired state of a GrainType."""

    grain_types: list[GrainTypeName] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra=LIST_SET,
        description="Grain type names, as the worker code knows them, this placement applies to; "
        "empty means the resource's name.",
    )
    selector: LabelSelector = Field(description="Labels of the worker pods (silos).")
    strategy: GrainStrategySpec = defaulted(
        GrainStrategySpec, "How a new activation picks its member."
    )
    filters: list[PlacementFilter] = Field(
        default_factory=list,
        max_length=8,
        description="Filters applied in order before the strategy.",
    )
    load_shedding: LoadShedding = defaulted(
        LoadShedding, "Thresholds above which members receive no new activations."
    )
    metrics: MetricsSpec = defaulted(
        MetricsSpec, "Where load figures come from (activation counts from the scrape endpoint)."
    )
    publish: PublishPolicy = defaulted(PublishPolicy, "How often the placement table is written.")


class GrainTypeStatus(ApiModel):
    """What the operator observed and published for a GrainType."""

    observed_generation: int = Field(
        0,
        ge=0,
        description=(
            "The metadata.generation this status reflects; 0 until the operator first saw the "
            "object, so that GitOps tools read a new object as in progress, not as current."
        ),
    )
    members: int | None = Field(None, ge=0, description="Worker pods selected.")
    compatible_members: int | None = Field(
        None, ge=0, description="Members that can host this grain type (Ready, not draining)."
    )
    overloaded_members: int | None = Field(
        None, ge=0, description="Compatible members above a load-shedding threshold."
    )
    table_version: int | None = Field(
        None, ge=0, description="Version of the published placement table; grows with each write."
    )
    placement_table: ObjectName | None = Field(
        None, description="ConfigMap holding the placement table (owned by this resource)."
    )
    last_publish_time: datetime | None = Field(
        None, description="When the placement table was last written."
    )
    conditions: Conditions


class GrainType(Resource):
    """Placement of new grain activations, Orleans-style: a strategy, filters and load shedding
    per grain type, served to workers as a placement table."""

    crd = CrdInfo(
        plural="graintypes",
        short_names=("gtype", "gtypes"),
        printer_columns=(
            PrinterColumn("Strategy", ".spec.strategy.name", description="Placement strategy."),
            condition_column("Ready"),
            PrinterColumn("Members", ".status.members", "integer", "Worker pods selected."),
            PrinterColumn(
                "Compatible", ".status.compatibleMembers", "integer", "Members hosting the type."
            ),
            PrinterColumn(
                "Overloaded", ".status.overloadedMembers", "integer", "Members shedding load."
            ),
            PrinterColumn("Version", ".status.tableVersion", "integer", "Placement table version."),
            AGE_COLUMN,
            PrinterColumn("Table", ".status.placementTable", priority=1),
            PrinterColumn("Published", ".status.lastPublishTime", "date", priority=1),
            condition_column("Ready", "reason", name="Reason", priority=1),
        ),
    )

    kind: Literal["GrainType"] = "GrainType"
    spec: GrainTypeSpec
    status: GrainTypeStatus | None = None

    def grain_type_names(self) -> list[str]:
        """The grain types this resource places: spec.grainTypes, or its own name."""
        return list(self.spec.grain_types) or [self.metadata.name or ""]
