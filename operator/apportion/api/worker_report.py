"""The worker report: what a worker pod serves apportion on its metrics endpoint (per-unit
load, activations, CPU and memory, release failures, serving), and the Prometheus text format
it travels in.

One definition for both sides: the worker library renders a `WorkerReport` with `render`, the
operator's collector reads it back with `WorkerReport.parse`. Workers in other languages expose
the same names (docs/metrics.md); any Prometheus client library produces text this parser reads.
Pure and standard-library only, so the worker library pays nothing for it.

    text = WorkerReport(unit_loads={"orders": {"3": 12.5}}, activations={"Cart": 40}).render()
    WorkerReport.parse(text).unit_loads["orders"]["3"]  # 12.5

Format: Prometheus text exposition 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/).
`parse` reads the whole format — HELP/TYPE comments, labels with escapes, NaN/±Inf, timestamps —
and skips families it is not asked for without parsing them, so a worker may serve its other
metrics (histograms, OpenMetrics exemplars) on the same endpoint.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

UNIT_LOAD = "apportion_unit_load"
ACTIVATIONS = "apportion_activations"
PROCESS_CPU_PERCENT = "apportion_process_cpu_percent"
CPU_COUNT = "apportion_cpu_count"
MEMORY_USAGE_BYTES = "apportion_memory_usage_bytes"
MEMORY_AVAILABLE_BYTES = "apportion_memory_available_bytes"
MEMORY_MAX_AVAILABLE_BYTES = "apportion_memory_max_available_bytes"
OVERLOADED = "apportion_overloaded"
RELEASE_FAILURES = "apportion_worker_release_failures_total"
RELEASES_FAILING = "apportion_worker_releases_failing"
SERVING = "apportion_worker_serving"
LEASE_EXPIRIES = "apportion_worker_serving_lease_expiries_total"

SET_LABEL = "set"
UNIT_LABEL = "unit"
GRAIN_TYPE_LABEL = "grain_type"


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """One metric family a worker serves: its labels, HELP text and Prometheus type."""

    name: str
    labels: tuple[str, ...]
    help: str
    type: Literal["gauge", "counter"] = "gauge"


METRICS: Mapping[str, MetricInfo] = MappingProxyType(
    {
        info.name: info
        for info in (
            MetricInfo(
                UNIT_LOAD,
                (SET_LABEL, UNIT_LABEL),
                "Current load of a unit (partition or shard) this worker owns, in the set's own "
                "measure (e.g. requests per second); one sample per owned unit, 0 included.",
            ),
            MetricInfo(
                ACTIVATIONS,
                (GRAIN_TYPE_LABEL,),
                "Grain activations of this type currently on this worker.",
            ),
            MetricInfo(
                PROCESS_CPU_PERCENT,
                (),
                "CPU used by the worker, percent of the CPUs available to it (0-100).",
            ),
            MetricInfo(CPU_COUNT, (), "CPUs available to the worker."),
            MetricInfo(MEMORY_USAGE_BYTES, (), "Memory the worker uses, in bytes."),
            MetricInfo(
                MEMORY_AVAILABLE_BYTES, (), "Memory still available to the worker, in bytes."
            ),
            MetricInfo(
                MEMORY_MAX_AVAILABLE_BYTES,
                (),
                "Memory the worker may use at most (its limit), in bytes.",
            ),
            MetricInfo(
                OVERLOADED,
                (),
                "1 when the worker declares itself overloaded (no new activations), else 0.",
            ),
            MetricInfo(
                RELEASE_FAILURES,
                (SET_LABEL,),
                "Release callbacks of the set that raised since the worker started; each is "
                "retried, and the release stays unacknowledged until one succeeds.",
                "counter",
            ),
            MetricInfo(
                RELEASES_FAILING,
                (SET_LABEL,),
                "Units of the set whose release callback failed and is being retried now.",
            ),
            MetricInfo(
                SERVING,
                (SET_LABEL,),
                "1 while the worker serves the set's units, 0 while its serving lease has run "
                "out (it could not confirm the assignment; docs/handoff.md).",
            ),
            MetricInfo(
                LEASE_EXPIRIES,
                (SET_LABEL,),
                "Times the worker's serving lease for the set ran out since it started.",
                "counter",
            ),
        )
    }
)


class ExpositionError(ValueError):
    """Text that is not valid Prometheus exposition, or apportion metrics with invalid values;
    the message names the line or the sample."""


# --- generic samples and the text format -------------------------------------------------------

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Go's strconv.ParseFloat forms Prometheus emits; Python's float() alone would also take "1_0".
_VALUE_RE = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[Ii]nf(?:inity)?)|NaN|nan"
)
_TIMESTAMP_RE = re.compile(r"-?[0-9]+")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of exposition: a metric name, its labels and a value."""

    name: str
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


def _format_value(value: float) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid metric name")


def render(samples: Iterable[Sample], *, helps: Mapping[str, str] | None = None) -> str:
    """Prometheus text for `samples`, grouped by family (first appearance first), each family
    with a `# TYPE` line (apportion's own type, else gauge) and a `# HELP` line (from `helps`,
    else apportion's own texts)."""
    families: dict[str, list[Sample]] = {}
    for sample in samples:
        families.setdefault(sample.name, []).append(sample)
    lines: list[str] = []
    for name, members in families.items():
        _check_name(name)
        text = (helps or {}).get(name) or (METRICS[name].help if name in METRICS else None)
        if text:
            lines.append(f"# HELP {name} {_escape_help(text)}")
        lines.append(f"# TYPE {name} {METRICS[name].type if name in METRICS else 'gauge'}")
        for sample in members:
            if sample.labels:
                for label in sample.labels:
                    if not _LABEL_NAME_RE.fullmatch(label):
                        raise ValueError(f"{label!r} is not a valid label name")
                pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels.items())
                lines.append(f"{name}{{{pairs}}} {_format_value(sample.value)}")
            else:
                lines.append(f"{name} {_format_value(sample.value)}")
    return "\n".join(lines) + "\n" if lines else ""


class _Line:
    """A cursor over one sample line."""

    __slots__ = ("number", "pos", "text")

    def __init__(self, text: str, number: int) -> None:
        self.text = text
        self.number = number
        self.pos = 0

    def error(self, what: str) -> ExpositionError:
        return ExpositionError(f"line {self.number}: {what}: {self.text[:200]!r}")

    def skip_blanks(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def match(self, pattern: re.Pattern[str], what: str) -> str:
        found = pattern.match(self.text, self.pos)
        if not found:
            raise self.error(f"expected {what}")
        self.pos = found.end()
        return found.group()

    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        self.pos += 1  # "{"
        while True:
            self.skip_blanks()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                return labels
            name = self.match(_LABEL_NAME_RE, "a label name")
            self.skip_blanks()
            if not self.text.startswith("=", self.pos):
                raise self.error(f'expected =" after label {name}')
            self.pos += 1
            self.skip_blanks()
            if not self.text.startswith('"', self.pos):
                raise self.error(f'expected =" after label {name}')
            self.pos += 1
            if name in labels:
                raise self.error(f"label {name} repeated")
            labels[name] = self.label_value()
            self.skip_blanks()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif not self.text.startswith("}", self.pos):
                raise self.error("expected , or } after a label value")

    def label_value(self) -> str:
        chars: list[str] = []
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char == '"':
                self.pos += 1
                return "".join(chars)
            if char == "\\":
                escaped = text[self.pos + 1 : self.pos + 2]
                if escaped not in _ESCAPES:
                    raise self.error(f"invalid escape \\{escaped} in a label value")
                chars.append(_ESCAPES[escaped])
                self.pos += 2
            else:
                chars.append(char)
                self.pos += 1
        raise self.error("unterminated label value")


def _family_of(line: str) -> str:
    end = 0
    while end < len(line) and line[end] not in "{ \t":
        end += 1
    return line[:end]


def _sample_lines(text: str) -> Iterator[tuple[int, str]]:
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t\r")
        if line and not line.startswith("#"):
            yield number, line


def parse(text: str, names: Collection[str] | None = None) -> list[Sample]:
    """The samples in `text`, in order; with `names`, only those families (others are skipped
    unparsed). Timestamps are read and dropped. Raises ExpositionError naming the line."""
    samples: list[Sample] = []
    for number, line in _sample_lines(text):
        if names is not None and _family_of(line) not in names:
            continue
        cursor = _Line(line, number)
        name = cursor.match(_NAME_RE, "a metric name")
        cursor.skip_blanks()
        labels = cursor.labels() if line.startswith("{", cursor.pos) else {}
        cursor.skip_blanks()
        value = float(cursor.match(_VALUE_RE, "a value"))
        cursor.skip_blanks()
        # An optional timestamp, then at most an OpenMetrics exemplar (" # {...} v").
        if cursor.pos < len(line) and not line.startswith("#", cursor.pos):
            cursor.match(_TIMESTAMP_RE, "a timestamp or the end of the line")
            cursor.skip_blanks()
            if cursor.pos < len(line) and not line.startswith("#", cursor.pos):
                raise cursor.error("unexpected text after the value")
        samples.append(Sample(name, value, labels))
    return samples


# --- what a worker reports ----------------------------------------------------------------------


def _finite(sample: Sample) -> float:
    if not math.isfinite(sample.value) or sample.value < 0:
        raise ExpositionError(
            f"{_describe(sample)} is {sample.value}: must be a finite number >= 0"
        )
    return sample.value


def _describe(sample: Sample) -> str:
    pairs = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
    return f"{sample.name}{{{pairs}}}" if pairs else sample.name


def _label(sample: Sample, label: str) -> str:
    value = sample.labels.get(label)
    if not value:
        raise ExpositionError(f"{_describe(sample)} needs a non-empty {label!r} label")
    return value


_SCALARS = {
    PROCESS_CPU_PERCENT: "cpu_percent",
    CPU_COUNT: "cpu_count",
    MEMORY_USAGE_BYTES: "memory_usage_bytes",
    MEMORY_AVAILABLE_BYTES: "memory_available_bytes",
    MEMORY_MAX_AVAILABLE_BYTES: "memory_max_available_bytes",
    OVERLOADED: "overloaded",
}
_INTEGERS = {CPU_COUNT, MEMORY_USAGE_BYTES, MEMORY_AVAILABLE_BYTES, MEMORY_MAX_AVAILABLE_BYTES}
_PER_SET = {
    RELEASE_FAILURES: "release_failures",
    RELEASES_FAILING: "releases_failing",
    SERVING: "serving",
    LEASE_EXPIRIES: "lease_expiries",
}


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """Everything one worker reports. Figures it does not know stay None (or empty)."""

    unit_loads: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Set name → unit → current load of each unit the worker owns."""
    activations: Mapping[str, int] = field(default_factory=dict)
    """Grain type → activations on this worker."""
    cpu_percent: float | None = None
    cpu_count: int | None = None
    memory_usage_bytes: int | None = None
    memory_available_bytes: int | None = None
    memory_max_available_bytes: int | None = None
    overloaded: bool | None = None
    release_failures: Mapping[str, int] = field(default_factory=dict)
    """Set name → release callbacks that raised (a counter)."""
    releases_failing: Mapping[str, int] = field(default_factory=dict)
    """Set name → units whose release is failing and being retried now."""
    serving: Mapping[str, int] = field(default_factory=dict)
    """Set name → 1 while serving, 0 while the serving lease has run out."""
    lease_expiries: Mapping[str, int] = field(default_factory=dict)
    """Set name → times the serving lease ran out (a counter)."""

    def samples(self) -> list[Sample]:
        out = [
            Sample(UNIT_LOAD, load, {SET_LABEL: set_name, UNIT_LABEL: unit})
            for set_name, loads in self.unit_loads.items()
            for unit, load in loads.items()
        ]
        out += [
            Sample(ACTIVATIONS, count, {GRAIN_TYPE_LABEL: grain_type})
            for grain_type, count in self.activations.items()
        ]
        for name, attribute in _SCALARS.items():
            value = getattr(self, attribute)
            if value is not None:
                out.append(Sample(name, int(value) if isinstance(value, bool) else value))
        for name, attribute in _PER_SET.items():
            out += [
                Sample(name, count, {SET_LABEL: set_name})
                for set_name, count in getattr(self, attribute).items()
            ]
        return out

    def render(self) -> str:
        """The text a worker serves on its metrics endpoint (Content-Type `CONTENT_TYPE`)."""
        return render(self.samples())

    @classmethod
    def from_samples(cls, samples: Iterable[Sample]) -> WorkerReport:
        """Read apportion's families from parsed samples; other families are ignored. Raises
        ExpositionError for a negative or non-finite value, a missing label or a duplicate."""
        unit_loads: dict[str, dict[str, float]] = {}
        activations: dict[str, int] = {}
        scalars: dict[str, float | int | bool] = {}
        per_set: dict[str, dict[str, int]] = {attribute: {} for attribute in _PER_SET.values()}
        for sample in samples:
            if sample.name == UNIT_LOAD:
                loads = unit_loads.setdefault(_label(sample, SET_LABEL), {})
                unit = _label(sample, UNIT_LABEL)
                if unit in loads:
                    raise ExpositionError(f"{_describe(sample)} appears twice")
                loads[unit] = _finite(sample)
            elif sample.name == ACTIVATIONS:
                grain_type = _label(sample, GRAIN_TYPE_LABEL)
                if grain_type in activations:
                    raise ExpositionError(f"{_describe(sample)} appears twice")
                activations[grain_type] = round(_finite(sample))
            elif sample.name in _PER_SET:
                counts = per_set[_PER_SET[sample.name]]
                set_name = _label(sample, SET_LABEL)
                if set_name in counts:
                    raise ExpositionError(f"{_describe(sample)} appears twice")
                counts[set_name] = round(_finite(sample))
            elif sample.name in _SCALARS:
                attribute = _SCALARS[sample.name]
                if attribute in scalars:
                    raise ExpositionError(f"{sample.name} appears twice")
                value = _finite(sample)
                if sample.name == OVERLOADED:
                    scalars[attribute] = value >= 0.5
                elif sample.name in _INTEGERS:
                    scalars[attribute] = round(value)
                else:
                    scalars[attribute] = value
        return cls(unit_loads=unit_loads, activations=activations, **per_set, **scalars)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, text: str) -> WorkerReport:
        """Read a scraped metrics page (only apportion's families are parsed)."""
        return cls.from_samples(parse(text, METRICS.keys()))
