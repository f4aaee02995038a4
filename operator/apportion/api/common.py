"""Pieces shared by every apportion resource.

The model base (camelCase JSON names, Python snake_case), bounded scalar types whose JSON schema
carries the limits CEL cost estimation needs, label selectors, workload references, metrics and
topology settings, custom strategies, and helpers to declare CEL rules and list semantics that
`apportion.api.crdgen` copies into the CRDs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

# --- declaring CRD extensions on models and fields -------------------------------------------


def cel(
    rule: str,
    message: str,
    *,
    reason: str | None = None,
    field_path: str | None = None,
) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; `reason` is e.g. FieldValueForbidden."""
    entry = {"rule": rule, "message": message}
    if reason:
        entry["reason"] = reason
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """`json_schema_extra` for a model or field carrying CEL rules."""
    return {"x-kubernetes-validations": list(rules)}


def immutable(what: str, why: str) -> dict[str, Any]:
    """`json_schema_extra` for a field that must never change once the object exists."""
    return validations(cel("self == oldSelf", f"{what} is immutable: {why}"))


def list_map(*keys: str) -> dict[str, Any]:
    """`json_schema_extra` for a list of objects merged by key (server-side apply, CEL)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


LIST_SET: dict[str, Any] = {"x-kubernetes-list-type": "set"}


def defaulted(model: type[ApiModel], description: str) -> Any:
    """A field holding a settings object that defaults to its defaults.

    The CRD carries the whole default object (not `{}`: the API server checks CEL rules on the
    default itself), so `kubectl get -o yaml` shows the effective settings.
    """
    return Field(
        default_factory=model,
        description=description,
        json_schema_extra=lambda schema: schema.update(default=model().to_json_dict()),
    )


def _compact(value: Any) -> Any:
    if isinstance(value, dict):
        items = ((k, _compact(v)) for k, v in value.items())
        return {k: v for k, v in items if v is not None and v != [] and v != {}}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


class ApiModel(BaseModel):
    """Base of every apportion API model: snake_case in Python, camelCase on the wire."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        validate_default=True,
    )

    def to_json_dict(self) -> dict[str, Any]:
        """The compact wire form: camelCase names, without None and empty lists or maps (as Go's
        omitempty). For a merge patch that must clear old values, use `model_dump(mode="json")`:
        its nulls delete fields and its empty lists replace old ones."""
        compact: dict[str, Any] = _compact(self.model_dump(mode="json", by_alias=True))
        return compact


# --- bounded scalar types -----------------------------------------------------------------------

DNS_SUBDOMAIN_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
LABEL_KEY_RE = (
    rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_LABEL_NAME}$"
)
LABEL_VALUE_RE = rf"^({_LABEL_NAME})?$"

ObjectName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_RE)
]
"""A Kubernetes object name (pods, workloads, ConfigMaps)."""

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317, pattern=LABEL_KEY_RE)]
"""A label key: optional DNS-subdomain prefix and `/`, then a name of up to 63 characters."""

LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE_RE)]

# Go's time.ParseDuration syntax, which CEL's duration() also accepts ("1m30s", "500ms").
# At most four parts of at most five digits (99999h is 11 years): CEL's duration() overflows
# past ~290 years with an error no user understands, so longer values are refused by the
# format rule, in words, before any bound is computed.
GO_DURATION_RE = r"^([0-9]{1,5}(\.[0-9]{1,9})?(ns|us|µs|ms|s|m|h)){1,4}$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_duration(value: str | timedelta | float) -> timedelta:
    """Parse a Go-style duration ("10s", "1m30s", "250ms"); numbers are seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    if not isinstance(value, str) or not re.fullmatch(GO_DURATION_RE, value):
        raise ValueError(
            f"{value!r} is not a duration like '10s', '1m30s' or '500ms' "
            "(up to 4 parts of at most 5 digits each)"
        )
    seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """Text the format rule accepts: whole seconds as seconds ("60s", "300s", so defaults
    round-trip as written), longer spans in hours, minutes and seconds ("27h46m40s"), less
    than a second in ms or us ("250ms", "1500us", "100.001ms")."""
    micros = round(value / timedelta(microseconds=1))
    if micros == 0:
        return "0s"  # as Go writes it: a switched-off duration reads as such in the defaults
    if micros < 1_000_000:
        if micros % 1000 == 0:
            return f"{micros // 1000}ms"
        return f"{micros}us" if micros < 100_000 else f"{micros / 1000:.3f}ms"
    whole, fraction = divmod(micros, 1_000_000)
    if whole < 100_000 and not fraction:
        return f"{whole}s"
    hours, rest = divmod(whole, 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{seconds}.{fraction:06d}".rstrip("0").rstrip(".") if fraction else str(seconds)
    parts = [(hours, "h"), (minutes, "m")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) + (f"{text}s" if text != "0" else "")


_DURATION_FORMAT = cel(
    f"self.matches(r'{GO_DURATION_RE}')",
    "must be a duration like '10s', '1m30s' or '500ms': up to 4 parts of at most 5 digits each "
    "(99999h at most)",
)

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema(
        {"type": "string", "maxLength": 64, "x-kubernetes-validations": [_DURATION_FORMAT]}
    ),
]
"""A timedelta in Python, a Go-style duration string ("10s", "1m30s") on the wire."""


def rfc3339(unix_seconds: float) -> str:
    """A Unix time as the API server writes times (metav1.Time: whole seconds, UTC)."""
    return datetime.fromtimestamp(unix_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds(rfc3339_time: str | None) -> float | None:
    """An API server time as Unix seconds; None for an absent one."""
    if not rfc3339_time:
        return None
    return datetime.fromisoformat(rfc3339_time.replace("Z", "+00:00")).timestamp()


def min_duration(what: str, minimum: str) -> dict[str, Any]:
    """CEL rules for a Duration field that must be at least `minimum`.

    They replace the type's own rules (pydantic merges `json_schema_extra` shallowly), so the
    format rule is repeated; the bound is skipped for malformed values, which get the format
    message alone.
    """
    return validations(
        _DURATION_FORMAT,
        cel(
            f"!self.matches(r'{GO_DURATION_RE}') || duration(self) >= duration('{minimum}')",
            f"{what} must be at least {minimum}",
        ),
    )


def max_duration(what: str, maximum: str) -> dict[str, Any]:
    """CEL rules for a Duration field that must be at most `maximum` (as `min_duration`)."""
    return validations(
        _DURATION_FORMAT,
        cel(
            f"!self.matches(r'{GO_DURATION_RE}') || duration(self) <= duration('{maximum}')",
            f"{what} must be at most {maximum}",
        ),
    )


def _parse_decimal(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not a non-negative decimal")
    return number


Decimal = Annotated[
    float,
    BeforeValidator(_parse_decimal),
    PlainSerializer(lambda x: f"{x:.2f}", return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$", "maxLength": 32}),
]
"""A float in Python, a decimal string with two places on the wire ("1.02"): Kubernetes API
conventions keep floating-point numbers out of resources, and the string reads well in columns."""


def int_or_string_schema(*rules: dict[str, str]) -> dict[str, Any]:
    """JSON schema of an int-or-string field (as Kubernetes' IntOrString) checked by CEL."""
    return {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-validations": list(rules),
    }


_PERCENT_RE = re.compile(r"^(100|[1-9]?[0-9])%$")


def _check_int_or_percent(value: int | str) -> int | str:
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{value!r} must be a non-negative integer or a percentage like '25%'")
    if isinstance(value, str) and not _PERCENT_RE.match(value):
        raise ValueError(f"{value!r} must be a percentage from '0%' to '100%'")
    return value


IntOrPercent = Annotated[
    int | str,
    AfterValidator(_check_int_or_percent),
    WithJsonSchema(
        int_or_string_schema(
            cel(
                "type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",
                "must be a non-negative integer or a percentage from '0%' to '100%'",
            )
        )
    ),
]
"""An absolute count or a percentage of a total, as Kubernetes' maxUnavailable."""

_PORT_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _check_port(value: int | str) -> int | str:
    if isinstance(value, int) and not 1 <= value <= 65535:
        raise ValueError(f"port {value} is not between 1 and 65535")
    if isinstance(value, str) and not (len(value) <= 15 and _PORT_NAME_RE.match(value)):
        raise ValueError(f"{value!r} is not a container port name")
    return value


Port = Annotated[
    int | str,
    AfterValidator(_check_port),
    WithJsonSchema(
        int_or_string_schema(
            cel(
                "type(self) == int ? self >= 1 && self <= 65535 : "
                "size(self) <= 15 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                "must be a port number from 1 to 65535 or a container port name (at most 15 "
                "lowercase alphanumeric characters or '-')",
            )
        )
    ),
]
"""A container port, by number or by name."""


def scaled_value(value: int | str, total: int, *, round_up: bool = True) -> int:
    """Resolve an IntOrPercent against `total` (as Kubernetes' GetScaledValueFromIntOrPercent)."""
    if isinstance(value, int):
        return value
    exact = int(value.rstrip("%")) * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)


# --- label selectors and workloads ---------------------------------------------------------------


class SelectorOperator(StrEnum):
    """How a label selector requirement relates a key to its values."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(ApiModel):
    """One requirement of a label selector, as in Kubernetes' own LabelSelector."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
                "values must be non-empty for operators In and NotIn, and empty for Exists and "
                "DoesNotExist",
            )
        )
    )

    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra=LIST_SET,
        description="Label values; non-empty for In and NotIn, empty for Exists and DoesNotExist.",
    )

    def to_query(self) -> str:
        match self.operator:
            case SelectorOperator.EXISTS:
                return self.key
            case SelectorOperator.DOES_NOT_EXIST:
                return f"!{self.key}"
            case _:
                op = "in" if self.operator is SelectorOperator.IN else "notin"
                return f"{self.key} {op} ({','.join(self.values)})"

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.operator:
            case SelectorOperator.EXISTS:
                return self.key in labels
            case SelectorOperator.DOES_NOT_EXIST:
                return self.key not in labels
            case SelectorOperator.IN:
                return labels.get(self.key) in self.values
            case SelectorOperator.NOT_IN:
                return labels.get(self.key) not in self.values
        raise AssertionError(self.operator)


class LabelSelector(ApiModel):
    """Selects worker pods by label, as Kubernetes' LabelSelector; all requirements must hold."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
                "(has(self.matchExpressions) && size(self.matchExpressions) > 0)",
                "selector must not be empty: an empty selector would select every pod in the "
                "namespace",
            ),
            cel(
                "!has(self.matchLabels) || self.matchLabels.all(k, "
                f"size(k) <= 317 && k.matches(r'{LABEL_KEY_RE}'))",
                "matchLabels keys must be valid label keys (optional DNS prefix and '/', then up "
                "to 63 alphanumeric characters, '-', '_' or '.')",
            ),
        )
    )

    match_labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels a worker pod must carry with exactly these values.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list,
        max_length=16,
        description="Further requirements a worker pod's labels must meet.",
    )

    def to_query(self) -> str:
        """The selector as a `labelSelector` query string ("app=w,tier in (a,b)")."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        parts += [r.to_query() for r in self.match_expressions]
        return ",".join(parts)

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


class WorkloadKind(StrEnum):
    """Kinds of workload whose pods can be members."""

    DEPLOYMENT = "Deployment"
    STATEFUL_SET = "StatefulSet"


class WorkloadRef(ApiModel):
    """The Deployment or StatefulSet (apps/v1, same namespace) that runs the worker pods."""

    kind: WorkloadKind = Field(description="Deployment or StatefulSet.")
    name: ObjectName = Field(description="Name of the workload in the same namespace.")


# --- metrics, topology, custom strategies --------------------------------------------------------


class ScrapeSpec(ApiModel):
    """Where each worker pod serves its Prometheus metrics (per-unit load, activation counts)."""

    port: Port = Field(description="Container port number or name on the worker pod.")
    path: str = Field(
        "/metrics",
        max_length=256,
        pattern=r"^/[!-~]*$",
        description="HTTP path of the metrics endpoint.",
    )
    interval: Duration = Field(
        parse_duration("10s"),
        description="How often each pod is scraped.",
        json_schema_extra=min_duration("scrape.interval", "1s"),
    )
    timeout: Duration = Field(
        parse_duration("2s"),
        description="Timeout of one scrape.",
        json_schema_extra=min_duration("scrape.timeout", "100ms"),
    )


class Smoothing(ApiModel):
    """How load samples are smoothed before placement decisions use them."""

    half_life: Duration = Field(
        parse_duration("30s"),
        description="Half-life of the exponentially weighted moving average of each load figure; "
        "longer is steadier, shorter reacts faster.",
        json_schema_extra=min_duration("smoothing.halfLife", "1s"),
    )


class MetricsSpec(ApiModel):
    """Where load figures come from. Without any, placement balances unit or activation counts
    and the status says so."""

    pod_metrics: bool = Field(
        True,
        description="Read CPU and memory of worker pods from metrics.k8s.io PodMetrics when that "
        "API is served.",
    )
    scrape: ScrapeSpec | None = Field(
        None, description="Scrape each worker pod's Prometheus endpoint for the load it reports."
    )
    smoothing: Smoothing = defaulted(Smoothing, "Smoothing of load samples.")


class TopologySpread(ApiModel):
    """Spread units across a topology domain (zone, node) of the worker pods."""

    topology_key: LabelKey = Field(
        description="Label key on the worker pods naming their domain, e.g. "
        "topology.kubernetes.io/zone."
    )
    max_skew: int = Field(
        1,
        ge=1,
        le=100000,
        description="Largest allowed difference in units between the fullest and emptiest domain.",
    )


class CustomStrategy(ApiModel):
    """A placement strategy supplied by a plug-in, found by entry-point name."""

    entry_point: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$",
        description="Name of the strategy's entry point: in the Python entry-point group "
        "`apportion.allocation_strategies` for PartitionSets and ShardSets, "
        "`apportion.grain_strategies` for GrainTypes (other worker libraries resolve it by the "
        "same name).",
    )
    parameters: dict[str, Annotated[str, StringConstraints(max_length=1024)]] = Field(
        default_factory=dict,
        max_length=32,
        description="Free-form string parameters passed to the strategy.",
    )


def strategy_option_rules(
    options: Mapping[str, str], also_allowed: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """CEL rules tying a strategy's option blocks to its `name`.

    `options` maps a strategy name to the field holding its options; `also_allowed` maps a
    strategy name to a further CEL condition under which its options are accepted (e.g. when it
    is the fallback of another strategy).
    """
    rules = []
    for name, field in options.items():
        allowed = f"self.name == '{name}'"
        if also_allowed and name in also_allowed:
            allowed += f" || ({also_allowed[name]})"
        rules.append(
            cel(
                f"!has(self.{field}) || {allowed}",
                f"strategy.{field} applies only when strategy.name is {name}",
                reason="FieldValueForbidden",
            )
        )
    return rules
