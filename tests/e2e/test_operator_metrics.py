"""The operator's /metrics, scraped from a running operator placing a PartitionSet over demo
workers, is valid Prometheus exposition by `promtool check metrics` (promtool built from Go
modules), and holds the metrics docs/operations.md documents, with the figures of the set."""

from __future__ import annotations

import subprocess
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.unitset import apply, demo_worker, get, ready_pods, unit_set, workers

EXPECTED = {
    # name in the exposition → documented in docs/operations.md
    "apportion_operator_build_info",
    "apportion_operator_leader",
    "apportion_operator_passes_total",
    "apportion_operator_pass_duration_seconds_bucket",
    "apportion_operator_plan_duration_seconds_bucket",
    "apportion_operator_moves_planned_total",
    "apportion_operator_moves_kept_total",
    "apportion_operator_moves_held_total",
    "apportion_operator_table_epoch",
    "apportion_operator_table_size_bytes",
    "apportion_operator_units",
    "apportion_operator_units_unowned",
    "apportion_operator_imbalance_ratio",
    "apportion_operator_set_condition",
    "apportion_operator_set_condition_transition_timestamp_seconds",
    "apportion_operator_rebalance_interval_seconds",
    "apportion_operator_member_units",
    "apportion_operator_handoffs_started_total",
    "apportion_operator_handoffs_ended_total",
    "apportion_operator_handoff_duration_seconds_bucket",
}
UNITS = "apportion_operator_member_units"


def test_metrics_pass_promtool_and_describe_the_set(
    operator, namespace, kubectl, wait_for, promtool
) -> None:
    apply(kubectl, namespace, workers("mw", 2, command=demo_worker("PartitionSet", "m")))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=mw")) == 2, 60, "2 demo workers")
    spec = {
        "partitions": 6,
        "workloadRef": {"kind": "StatefulSet", "name": "mw"},
        "rebalance": {"interval": "1s", "handoffTimeout": "60s"},
    }
    apply(kubectl, namespace, unit_set("PartitionSet", "m", spec))
    # A GrainType beside it, selecting nobody: its passes are counted under its own kind.
    grains = {"selector": {"matchLabels": {"app": "nobody"}}}
    apply(kubectl, namespace, unit_set("GrainType", "g", grains))
    kubectl("wait", "-n", namespace, "--for=condition=Balanced", "pset/m", "--timeout=60s")
    # A third worker: one unit of each of the first two moves to it through a hand-off.
    kubectl("scale", "-n", namespace, "statefulset/mw", "--replicas=3")
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=mw")) == 3, 60, "3 demo workers")

    def settled() -> bool:
        status = get(kubectl, namespace, "pset", "m")["status"]
        rows = [r["units"] for r in status.get("memberUnits", [])]
        return rows == [2, 2, 2] and status["movesInProgress"] == 0

    wait_for(settled, 60, "2 units each after scaling out")
    status = get(kubectl, namespace, "pset", "m")["status"]
    ours = {"kind": "PartitionSet", "namespace": namespace, "set": "m"}

    def parsed(text: str) -> dict[str, list[Any]]:
        """Samples by name, of this set (or of no set), as a scraper parses them."""
        found: dict[str, list[Any]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if all(s.labels.get(k, v) == v for k, v in ours.items()):
                    found.setdefault(s.name, []).append(s)
        return found

    def scraped() -> str:
        samples = parsed(text := operator.metrics())
        members = {s.labels["member"]: s.value for s in samples.get(UNITS, [])}
        epochs = [s.value for s in samples.get("apportion_operator_table_epoch", [])]
        return (
            text
            if members == {"mw-0": 2, "mw-1": 2, "mw-2": 2} and epochs == [status["epoch"]]
            else ""
        )

    text = wait_for(scraped, 30, "the operator's metrics never showed the set's figures")
    checked = subprocess.run(
        [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    samples = parsed(text)
    assert samples.keys() >= EXPECTED, sorted(EXPECTED - samples.keys())
    assert [s.value for s in samples["apportion_operator_units"]] == [6]
    assert [s.value for s in samples["apportion_operator_units_unowned"]] == [0]
    assert [s.value for s in samples["apportion_operator_leader"]] == [1]
    balanced = [
        s
        for s in samples["apportion_operator_set_condition"]
        if s.labels["condition"] == "Balanced"
    ]
    assert [s.value for s in balanced] == [1]
    assert [s.value for s in samples["apportion_operator_handoffs_started_total"]] == [2]
    ended = {
        s.labels["outcome"]: s.value for s in samples["apportion_operator_handoffs_ended_total"]
    }
    assert ended == {"completed": 2}
    durations = samples["apportion_operator_handoff_duration_seconds_count"]
    assert [(s.labels["outcome"], s.value) for s in durations] == [("completed", 2)]
    grain_passes = [
        s
        for s in operator.samples_of("apportion_operator_passes_total")
        if s.labels["kind"] == "GrainType" and s.labels["namespace"] == namespace
    ]
    assert grain_passes
    assert all(s.labels["set"] == "g" for s in grain_passes)
