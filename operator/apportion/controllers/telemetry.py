"""The operator's own Prometheus metrics (`apportion operator --metrics HOST:PORT` serves them at
`/metrics`; docs/operations.md lists them). Workers' metrics are another thing: see
`controllers.load_collector`, which scrapes them.

Every metric is defined here, once; the controllers record where they already compute the
figure. Labels are bounded: `kind`, `namespace`, `set` per set, `member` only on the per-member
gauges, and small closed sets of values for `result`, `outcome`, `reason` and `resource`. A set's
series (and a member's) are removed when the set (member) goes, so a long-lived operator does not
accumulate the names of every pod it ever saw.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Final

import httpx2
from lightkube import ApiError
from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    start_http_server,
)

from apportion import __version__

SET_LABELS: Final = ("kind", "namespace", "set")
MEMBER_LABELS: Final = (*SET_LABELS, "member")

# Passes take milliseconds on small sets and seconds on large ones (or a slow API server).
_PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A hand-off lasts from a worker's ack (sub-second) to spec.rebalance.handoffTimeout (minutes).
_HANDOFF_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

BUILD = Info("apportion_operator_build", "Version of the running operator.")
LEADER = Gauge(
    "apportion_operator_leader",
    "1 while this replica places units (standalone, or holding the leader-election Lease), "
    "0 while it stands by.",
)
PASSES = Counter(
    "apportion_operator_passes_total",
    "Placement passes by result: published (a new table), unchanged, conflict (another "
    "writer was first), failed.",
    (*SET_LABELS, "result"),
)
PASS_DURATION = Histogram(
    "apportion_operator_pass_duration_seconds",
    "Wall time of one placement pass, reads and writes included.",
    SET_LABELS,
    buckets=_PASS_BUCKETS,
)
PLAN_DURATION = Histogram(
    "apportion_operator_plan_duration_seconds",
    "Time the pure engine took to plan one pass (no I/O).",
    SET_LABELS,
    buckets=_PASS_BUCKETS,
)
MOVES_PLANNED = Counter(
    "apportion_operator_moves_planned_total",
    "Unit moves the strategy planned, over passes.",
    SET_LABELS,
)
MOVES_KEPT = Counter(
    "apportion_operator_moves_kept_total", "Planned unit moves a pass made (started).", SET_LABELS
)
MOVES_HELD = Counter(
    "apportion_operator_moves_held_total",
    "Planned optional unit moves a pass left for a later round (maxMovesPerRound, rollouts).",
    SET_LABELS,
)
HANDOFFS_STARTED = Counter(
    "apportion_operator_handoffs_started_total",
    "Units whose hand-off to another member began.",
    SET_LABELS,
)
HANDOFFS_ENDED = Counter(
    "apportion_operator_handoffs_ended_total",
    "Units whose hand-off ended, by outcome: completed (the owner acknowledged), cancelled "
    "(no longer needed), timed_out (reassigned without the owner's ack).",
    (*SET_LABELS, "outcome"),
)
HANDOFF_DURATION = Histogram(
    "apportion_operator_handoff_duration_seconds",
    "From a unit's release being published to its hand-off ending, by outcome.",
    (*SET_LABELS, "outcome"),
    buckets=_HANDOFF_BUCKETS,
)
RELEASES_FAILING = Gauge(
    "apportion_operator_releases_failing",
    "Units in hand-off whose owner reports its release callback failing: it retries, and the "
    "hand-off waits for it until handoffTimeout.",
    SET_LABELS,
)
SERVING_SUSPENSIONS = Counter(
    "apportion_operator_serving_suspensions_total",
    "Times members stopped serving because their serving lease ran out, counted when their "
    "acks tell of it after they serve again.",
    SET_LABELS,
)
TABLE_EPOCH = Gauge(
    "apportion_operator_table_epoch", "Epoch of the published assignment table.", SET_LABELS
)
TABLE_SIZE = Gauge(
    "apportion_operator_table_size_bytes",
    "Bytes of the published table's ConfigMaps (data and binaryData as sent).",
    SET_LABELS,
)
UNITS = Gauge(
    "apportion_operator_units", "Units of the set (its partition or shard count).", SET_LABELS
)
UNITS_UNOWNED = Gauge(
    "apportion_operator_units_unowned",
    "Units no live member owns: nobody serves them.",
    SET_LABELS,
)
IMBALANCE = Gauge(
    "apportion_operator_imbalance_ratio",
    "Most loaded eligible member over the mean (1 is perfect balance).",
    SET_LABELS,
)
CONDITION = Gauge(
    "apportion_operator_set_condition",
    "1 when the set's condition is True, else 0 (Ready, Reconciling, Stalled, Balanced, "
    "Progressing, Degraded, Resharding).",
    (*SET_LABELS, "condition"),
)
CONDITION_SINCE = Gauge(
    "apportion_operator_set_condition_transition_timestamp_seconds",
    "When the set's condition last changed status (Unix time).",
    (*SET_LABELS, "condition"),
)
REBALANCE_INTERVAL = Gauge(
    "apportion_operator_rebalance_interval_seconds",
    "spec.rebalance.interval of the set: the length of one rebalancing round.",
    SET_LABELS,
)
MEMBER_UNITS = Gauge("apportion_operator_member_units", "Units a member owns.", MEMBER_LABELS)
MEMBER_LOAD = Gauge(
    "apportion_operator_member_load",
    "Sum of the smoothed loads of a member's units (only for sets with a metrics scrape).",
    MEMBER_LABELS,
)
API_ERRORS = Counter(
    "apportion_operator_api_errors_total",
    "Failed API requests of placement passes, by reason: Conflict (another writer changed the "
    "table first), the API status reason (Forbidden, Invalid, ...), or Unreachable.",
    (*SET_LABELS, "reason"),
)
WATCH_RESTARTS = Counter(
    "apportion_operator_watch_restarts_total",
    "Watches of the operator's caches that ended in an error and were opened again, by "
    "resource and reason (expired: 410 Gone, listed again; rewound: the API server holds "
    "less than the watch saw, restored from a backup, listed again; silent: nothing for "
    "SILENCE_TIMEOUT; error: anything else; both resumed from the last version seen).",
    ("resource", "reason"),
)

_SET_METRICS = (
    PASSES,
    PASS_DURATION,
    PLAN_DURATION,
    MOVES_PLANNED,
    MOVES_KEPT,
    MOVES_HELD,
    HANDOFFS_STARTED,
    HANDOFFS_ENDED,
    HANDOFF_DURATION,
    RELEASES_FAILING,
    SERVING_SUSPENSIONS,
    TABLE_EPOCH,
    TABLE_SIZE,
    UNITS,
    UNITS_UNOWNED,
    IMBALANCE,
    CONDITION,
    CONDITION_SINCE,
    REBALANCE_INTERVAL,
    MEMBER_UNITS,
    MEMBER_LOAD,
    API_ERRORS,
)


def serve(address: str) -> None:
    """Serve /metrics on `address` ("HOST:PORT", or ":PORT" for every interface) from a thread."""
    host, _, port = address.rpartition(":")
    # `_created` series double the counters and histograms for a figure nobody alerts on.
    # (prometheus_client leaves the function unannotated.)
    disable_created_metrics()  # type: ignore[no-untyped-call]
    BUILD.info({"version": __version__})
    start_http_server(int(port), addr=host or "0.0.0.0", registry=REGISTRY)


def error_reason(error: BaseException) -> str | None:
    """The `reason` label of an API failure; None when the failure did not come from the API."""
    if isinstance(error, ApiError):
        return error.status.reason or f"Status{error.status.code}"
    if isinstance(error, httpx2.TransportError):
        return "Unreachable"
    return None


@contextmanager
def timed(histogram: Histogram, labels: tuple[str, ...]) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        histogram.labels(*labels).observe(time.perf_counter() - started)


def record_members(
    labels: tuple[str, str, str],
    units: Mapping[str, int],
    loads: Mapping[str, float] | None,
) -> None:
    """Per-member units (and loads, when the set has them); drops the series of members gone."""
    # The registry is the record of which members have series: no bookkeeping beside it.
    previous = {key[3] for key in _label_values(MEMBER_UNITS) if key[:3] == labels}
    for member in previous - units.keys():
        MEMBER_UNITS.remove(*labels, member)
        if loads is None or member not in loads:
            _remove(MEMBER_LOAD, (*labels, member))
    for member, count in units.items():
        MEMBER_UNITS.labels(*labels, member).set(count)
        if loads is not None:
            MEMBER_LOAD.labels(*labels, member).set(loads.get(member, 0.0))
        else:
            _remove(MEMBER_LOAD, (*labels, member))


def forget_set(labels: tuple[str, str, str]) -> None:
    """The set is gone: remove every series labelled with it."""
    for metric in _SET_METRICS:
        for key in list(_label_values(metric)):
            if key[: len(labels)] == labels:
                metric.remove(*key)


def _label_values(metric: Counter | Gauge | Histogram) -> list[tuple[str, ...]]:
    # prometheus_client keeps a labelled metric's children in `_metrics`; it has no public
    # listing, and removing by prefix is what a set's deletion needs.
    return [tuple(key) for key in metric._metrics]


def _remove(metric: Gauge, key: tuple[str, ...]) -> None:
    if key in metric._metrics:
        metric.remove(*key)
