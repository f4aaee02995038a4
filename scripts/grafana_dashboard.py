"""Generate manifests/monitoring/dashboards/apportion.json, the Grafana dashboard of one set
(`make dashboard`), with grafana-foundation-sdk: units and load per pod, imbalance, moves and
hand-off latency, table epochs, errors.

Every query names only metrics the operator exports (`apportion.controllers.telemetry`,
listed in docs/operations.md): tests/unit/test_grafana_dashboard.py holds every query to them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Final

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

OUTPUT: Final = (
    Path(__file__).resolve().parents[1] / "manifests/monitoring/dashboards/apportion.json"
)

DATASOURCE: Final = DataSourceRef(type_val="prometheus", uid="${datasource}")
# One set at a time: the variables pick it; every per-set query filters on all three labels.
SET: Final = 'kind="$kind", namespace="$namespace", set="$set"'
WIDTH: Final = 24  # Grafana's grid


def metric_names(expr: str) -> set[str]:
    """The apportion metric names a PromQL expression selects."""
    return set(re.findall(r"\bapportion_[a-z0-9_]+", expr))


def query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref)
        .datasource(DATASOURCE)
        .range()
    )


def graph(title: str, description: str, unit: str, *queries: tuple[str, str]) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(WIDTH // 2)
    )
    for ref, (expr, legend) in zip("ABCDEFGH", queries, strict=False):
        panel = panel.with_target(query(expr, legend, ref))
    return panel


def single(title: str, description: str, unit: str, expr: str) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(4)
        .span(WIDTH // 4)
        .with_target(query(expr, "", "A"))
    )


def label_variable(name: str, label: str, selector: str) -> dashboard.QueryVariable:
    """A variable choosing among the values of label `name` of the series `selector` picks."""
    matchers = f"{{{selector}}}" if selector else ""
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values(apportion_operator_units{matchers}, {name})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


Panel = timeseries.Panel | stat.Panel


def sections() -> list[tuple[str, list[Panel]]]:
    """The dashboard's rows and their panels, top to bottom."""
    rate = "[$__rate_interval]"
    handoff_latency = (
        "histogram_quantile({q}, sum by (le) (rate("
        f'apportion_operator_handoff_duration_seconds_bucket{{{{{SET}, outcome="completed"}}}}'
        f"{rate})))"
    )
    p95 = "histogram_quantile(0.95, sum by (le) (rate({metric}_bucket{{{selector}}}" + rate + ")))"
    placement: list[Panel] = [
        single("Units", "The set's unit count.", "short", f"apportion_operator_units{{{SET}}}"),
        single(
            "Unowned units",
            "Units no live member owns: nobody serves them.",
            "short",
            f"apportion_operator_units_unowned{{{SET}}}",
        ),
        single(
            "Imbalance",
            "Most loaded eligible member over the mean; 1 is perfect balance.",
            "none",
            f"apportion_operator_imbalance_ratio{{{SET}}}",
        ),
        single(
            "Table epoch",
            "Epoch of the published assignment table.",
            "none",
            f"apportion_operator_table_epoch{{{SET}}}",
        ),
        graph(
            "Units per pod",
            "Units each member owns.",
            "short",
            (f"apportion_operator_member_units{{{SET}}}", "{{member}}"),
        ),
        graph(
            "Load per pod",
            "Sum of the smoothed loads of each member's units (sets with a metrics scrape).",
            "short",
            (f"apportion_operator_member_load{{{SET}}}", "{{member}}"),
        ),
        graph(
            "Imbalance over time",
            "Most loaded eligible member over the mean.",
            "none",
            (f"apportion_operator_imbalance_ratio{{{SET}}}", "imbalance"),
        ),
        graph(
            "Table epoch and size",
            "The published table's epoch (a step per new table) and its ConfigMaps' bytes.",
            "short",
            (f"apportion_operator_table_epoch{{{SET}}}", "epoch"),
            (f"apportion_operator_table_size_bytes{{{SET}}}", "bytes"),
        ),
    ]
    moves: list[Panel] = [
        graph(
            "Moves",
            "Unit moves per second: planned by the strategy, kept (started) by passes, held for "
            "a later round.",
            "ops",
            *(
                (f"sum(rate(apportion_operator_moves_{what}_total{{{SET}}}{rate}))", what)
                for what in ("planned", "kept", "held")
            ),
        ),
        graph(
            "Hand-offs",
            "Hand-offs per second: started, and ended by outcome.",
            "ops",
            (f"sum(rate(apportion_operator_handoffs_started_total{{{SET}}}{rate}))", "started"),
            (
                f"sum by (outcome) (rate(apportion_operator_handoffs_ended_total{{{SET}}}{rate}))",
                "{{outcome}}",
            ),
        ),
        graph(
            "Hand-off latency",
            "From a unit's release being published to its hand-off ending (completed ones).",
            "s",
            *((handoff_latency.format(q=q), f"p{round(q * 100)}") for q in (0.5, 0.95, 0.99)),
        ),
        graph(
            "Pass duration",
            "Wall time of a placement pass (p95) and the engine's share of it.",
            "s",
            (p95.format(metric="apportion_operator_pass_duration_seconds", selector=SET), "pass"),
            (p95.format(metric="apportion_operator_plan_duration_seconds", selector=SET), "plan"),
        ),
    ]
    errors: list[Panel] = [
        graph(
            "Passes by result",
            "Placement passes per second: published, unchanged, conflict, failed.",
            "ops",
            (
                f"sum by (result) (rate(apportion_operator_passes_total{{{SET}}}{rate}))",
                "{{result}}",
            ),
        ),
        graph(
            "API errors and watch restarts",
            "Failed API requests of the set's passes per second, by reason (Conflict, "
            "Forbidden, Unreachable, ...), and the operator's watch restarts (all sets).",
            "ops",
            (
                f"sum by (reason) (rate(apportion_operator_api_errors_total{{{SET}}}{rate}))",
                "{{reason}}",
            ),
            (
                f"sum by (resource) (rate(apportion_operator_watch_restarts_total{rate}))",
                "watch restarts: {{resource}}",
            ),
        ),
    ]
    return [("Placement", placement), ("Moves and hand-offs", moves), ("Errors", errors)]


def build() -> dict[str, object]:
    """The dashboard as Grafana's JSON model."""
    board = (
        dashboard.Dashboard("apportion: set")
        .uid("apportion-set")
        .description("One apportion set: placement, balance, hand-offs and errors.")
        .tags(["apportion", "kubernetes"])
        .refresh("30s")
        .time("now-6h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(label_variable("kind", "Kind", ""))
        .with_variable(label_variable("namespace", "Namespace", 'kind="$kind"'))
        .with_variable(label_variable("set", "Set", 'kind="$kind", namespace="$namespace"'))
    )
    ids = iter(range(1, 100))  # Grafana keys panel state by id: unique, stable across runs
    for title, panels in sections():
        board = board.with_row(dashboard.Row(title).id(next(ids)))
        for panel in panels:
            board = board.with_panel(panel.id(next(ids)))
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUTPUT.write_text(render())
    print(OUTPUT, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
