"""apportion's alerts (manifests/monitoring/rules.yaml) checked by the real promtool: the rules
file and the PrometheusRule wrapper pass `promtool check rules`, the wrapper is what
scripts/prometheus_rule.py generates from the rules file, and `promtool test rules` shows, on
synthetic series, each alert firing when it should and staying silent when it should not."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"
RULES = MONITORING / "rules.yaml"
SET_A = {"kind": "PartitionSet", "namespace": "shop", "set": "orders"}
SET_B = {"kind": "ShardSet", "namespace": "shop", "set": "carts"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def description(alert: str) -> str:
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    return next(r for r in rules if r.get("alert") == alert)["annotations"]["description"]


def firing(alert: str, labels: dict[str, str], summary: str, severity: str) -> dict[str, Any]:
    return {
        "exp_labels": {**labels, "severity": severity},
        "exp_annotations": {"summary": summary, "description": description(alert)},
    }


def check(alert: str, at: str, expected: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": expected}


def case(input_series: list[dict[str, str]], *checks: dict[str, Any]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": input_series, "alert_rule_test": list(checks)}


UNOWNED = "apportion_operator_units_unowned"
ENDED = "apportion_operator_handoffs_ended_total"
CONDITION = "apportion_operator_set_condition"
SINCE = "apportion_operator_set_condition_transition_timestamp_seconds"
INTERVAL = "apportion_operator_rebalance_interval_seconds"
ERRORS = "apportion_operator_api_errors_total"
BALANCED = {"condition": "Balanced"}
SERVING = "apportion_worker_serving"
SUSPENSIONS = "apportion_operator_serving_suspensions_total"

CASES = [
    # Units unowned for 5 minutes fire; a one-minute gap (a pod replaced) does not.
    case(
        [
            series(UNOWNED, SET_A, "0 0 2x20"),
            series(UNOWNED, SET_B, "0 3 0x20"),
        ],
        check("ApportionUnitsUnowned", "5m", []),
        check(
            "ApportionUnitsUnowned",
            "8m",
            [
                firing(
                    "ApportionUnitsUnowned",
                    SET_A,
                    "PartitionSet shop/orders: 2 unit(s) unowned",
                    "critical",
                )
            ],
        ),
    ),
    # A timed-out hand-off alerts for 15 minutes; completed ones never do.
    case(
        [
            series(ENDED, {**SET_A, "outcome": "timed_out"}, "0x5 2x40"),
            series(ENDED, {**SET_B, "outcome": "completed"}, "0+4x40"),
        ],
        check("ApportionHandoffTimedOut", "3m", []),
        check(
            "ApportionHandoffTimedOut",
            "10m",
            [
                firing(
                    "ApportionHandoffTimedOut",
                    SET_A,
                    "PartitionSet shop/orders: hand-offs timed out",
                    "warning",
                )
            ],
        ),
        check("ApportionHandoffTimedOut", "30m", []),
    ),
    # A worker serving nothing for a minute alerts, counted per set; one that stops for less
    # than a minute (a lease that ran out and was confirmed again) does not.
    case(
        [
            series(SERVING, {"namespace": "shop", "set": "orders", "pod": "w-0"}, "1 0x10"),
            series(SERVING, {"namespace": "shop", "set": "orders", "pod": "w-1"}, "1 0x10"),
            series(SERVING, {"namespace": "shop", "set": "orders", "pod": "w-2"}, "1x10"),
            series(SERVING, {"namespace": "shop", "set": "carts", "pod": "c-0"}, "1 0 1x10"),
        ],
        check("ApportionWorkersNotServing", "1m", []),
        check(
            "ApportionWorkersNotServing",
            "3m",
            [
                firing(
                    "ApportionWorkersNotServing",
                    {"namespace": "shop", "set": "orders"},
                    "shop/orders: 2 worker(s) serve nothing",
                    "critical",
                )
            ],
        ),
    ),
    # Suspensions told after the fact alert for 15 minutes; none, never.
    case(
        [
            series(SUSPENSIONS, SET_A, "0x5 3x40"),
            series(SUSPENSIONS, SET_B, "0x40"),
        ],
        check("ApportionServingSuspended", "3m", []),
        check(
            "ApportionServingSuspended",
            "10m",
            [
                firing(
                    "ApportionServingSuspended",
                    SET_A,
                    "PartitionSet shop/orders: workers stopped serving for a while",
                    "warning",
                )
            ],
        ),
        check("ApportionServingSuspended", "30m", []),
    ),
    # Not Balanced since t=0: with 1 s rounds the 15 minute floor applies; with 2 minute rounds
    # 10 rounds (20 minutes) do. A Balanced set never alerts.
    case(
        [
            series(CONDITION, {**SET_A, **BALANCED}, "0x30"),
            series(SINCE, {**SET_A, **BALANCED}, "0x30"),
            series(INTERVAL, SET_A, "1x30"),
            series(CONDITION, {**SET_B, **BALANCED}, "0x30"),
            series(SINCE, {**SET_B, **BALANCED}, "0x30"),
            series(INTERVAL, SET_B, "120x30"),
            series(CONDITION, {**SET_B, "set": "fine", **BALANCED}, "1x30"),
            series(SINCE, {**SET_B, "set": "fine", **BALANCED}, "0x30"),
            series(INTERVAL, {**SET_B, "set": "fine"}, "1x30"),
        ],
        check("ApportionSetNotBalanced", "14m", []),
        check(
            "ApportionSetNotBalanced",
            "16m",
            [
                firing(
                    "ApportionSetNotBalanced",
                    {**SET_A, **BALANCED},
                    "PartitionSet shop/orders is not Balanced",
                    "warning",
                )
            ],
        ),
        check(
            "ApportionSetNotBalanced",
            "21m",
            [
                firing(
                    "ApportionSetNotBalanced",
                    {**SET_A, **BALANCED},
                    "PartitionSet shop/orders is not Balanced",
                    "warning",
                ),
                firing(
                    "ApportionSetNotBalanced",
                    {**SET_B, **BALANCED},
                    "ShardSet shop/carts is not Balanced",
                    "warning",
                ),
            ],
        ),
    ),
    # No replica scraped for 5 minutes: down. Replicas up but all standing by: no leader.
    case(
        [series("up", {"job": "something-else"}, "1x20")],
        check("ApportionOperatorDown", "3m", []),
        check(
            "ApportionOperatorDown",
            "6m",
            [
                firing(
                    "ApportionOperatorDown",
                    {},
                    "No apportion operator replica is scraped",
                    "critical",
                )
            ],
        ),
    ),
    case(
        [
            series("apportion_operator_build_info", {"pod": "op-0", "version": "0.1.0"}, "1x20"),
            series("apportion_operator_leader", {"pod": "op-0"}, "0x20"),
            series("apportion_operator_build_info", {"pod": "op-1", "version": "0.1.0"}, "1x20"),
            series("apportion_operator_leader", {"pod": "op-1"}, "0x20"),
        ],
        check("ApportionOperatorDown", "10m", []),
        check("ApportionOperatorNoLeader", "3m", []),
        check(
            "ApportionOperatorNoLeader",
            "6m",
            [
                firing(
                    "ApportionOperatorNoLeader",
                    {},
                    "apportion operator replicas run, but none places units",
                    "critical",
                )
            ],
        ),
    ),
    case(
        [
            series("apportion_operator_leader", {"pod": "op-0"}, "0x20"),
            series("apportion_operator_leader", {"pod": "op-1"}, "1x20"),
        ],
        check("ApportionOperatorNoLeader", "10m", []),
    ),
    # Conflicts: 6 a minute for 10 minutes alert, one a minute does not. Other API errors
    # alert while they keep coming, by reason, and not once they stopped.
    case(
        [
            series(ERRORS, {**SET_A, "reason": "Conflict"}, "0+6x40"),
            series(ERRORS, {**SET_B, "reason": "Conflict"}, "0+1x40"),
            series(ERRORS, {**SET_A, "reason": "Forbidden"}, "0+1x40"),
            series(ERRORS, {**SET_B, "reason": "Unreachable"}, "0 1 2 2x40"),
        ],
        check("ApportionWriteConflictsRising", "5m", []),
        check(
            "ApportionWriteConflictsRising",
            "20m",
            [
                firing(
                    "ApportionWriteConflictsRising",
                    SET_A,
                    "PartitionSet shop/orders: table write conflicts keep coming",
                    "warning",
                )
            ],
        ),
        check(
            "ApportionAPIErrors",
            "20m",
            [
                firing(
                    "ApportionAPIErrors",
                    {**SET_A, "reason": "Forbidden"},
                    "PartitionSet shop/orders: API requests fail (Forbidden)",
                    "warning",
                )
            ],
        ),
    ),
]


def promtool_run(promtool: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, check=False)


def test_the_rules_file_and_the_prometheus_rule_pass_promtool_check(
    promtool: Path, tmp_path: Path
) -> None:
    wrapped = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert wrapped["kind"] == "PrometheusRule"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(wrapped["spec"]))
    for path in (RULES, spec):
        checked = promtool_run(promtool, "check", "rules", str(path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "SUCCESS: 9 rules found" in checked.stdout


def test_the_prometheus_rule_is_generated_from_the_rules_file() -> None:
    from scripts import prometheus_rule

    assert (MONITORING / "prometheusrule.yaml").read_text() == prometheus_rule.render(), (
        "stale: run `make monitoring`"
    )


def test_each_alert_fires_when_it_should_and_only_then(promtool: Path, tmp_path: Path) -> None:
    tests = tmp_path / "tests.yaml"
    tests.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": CASES})
    )
    result = promtool_run(promtool, "test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {r["alert"] for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    tested = {c["alertname"] for case in CASES for c in case["alert_rule_test"]}
    assert tested == alerts


@pytest.mark.parametrize("broken", ["0 0 2x20"])
def test_promtool_test_rules_can_fail(promtool: Path, tmp_path: Path, broken: str) -> None:
    """The harness must be able to fail: an alert expected where it cannot fire."""
    tests = tmp_path / "tests.yaml"
    wrong = case(
        [series(UNOWNED, SET_A, broken)],
        check(
            "ApportionUnitsUnowned", "3m", [firing("ApportionUnitsUnowned", SET_A, "x", "critical")]
        ),
    )
    tests.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [wrong]})
    )
    assert promtool_run(promtool, "test", "rules", str(tests)).returncode != 0
