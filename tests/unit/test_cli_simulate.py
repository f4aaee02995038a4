"""`apportion simulate`: exit codes, JSON shape, text tables, plots and bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from apportion.cli import main
from apportion.engine.scenarios import COMPARE, GRAIN_STRATEGIES, SCENARIO_NAMES

SMALL = ["--units", "40", "--members", "4", "--steps", "2"]
STEP_KEYS = {
    "step",
    "event",
    "members",
    "eligible",
    "units",
    "moves",
    "lowerBound",
    "rounds",
    "converged",
    "seconds",
    "maxMean",
    "loadMaxMean",
    "movedLoad",
    "stranded",
    "notes",
    "memberLoads",
}


def simulate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["simulate", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_shape_of_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    document = simulate_json(capsys, *SMALL, "--seed", "3")
    assert {k: document[k] for k in ("seed", "units", "members", "interval")} == {
        "seed": 3,
        "units": 40,
        "members": 4,
        "interval": 10.0,
    }
    assert [s["name"] for s in document["scenarios"]] == list(SCENARIO_NAMES)
    for scenario in document["scenarios"]:
        if scenario["kind"] == "grains":
            assert [r["label"] for r in scenario["runs"]] == list(GRAIN_STRATEGIES)
            for run in scenario["runs"]:
                assert set(run) == {
                    "label",
                    "maxOverMean",
                    "placements",
                    "failures",
                    "counts",
                    "steps",
                }
                assert sum(run["counts"].values()) == run["placements"]
            continue
        assert scenario["kind"] == "allocation"
        assert scenario["lowerBound"] == ("forced moves" if scenario["loads"] else "count floor")
        (run,) = scenario["runs"]
        assert run["strategy"] == "Balanced"
        assert run["spec"] == {"name": "Balanced"}
        assert set(run["initial"]) == STEP_KEYS
        assert [s["step"] for s in run["steps"]] == [1, 2]
        for step in run["steps"]:
            assert set(step) == STEP_KEYS
            assert (step["loadMaxMean"] is None) == (not scenario["loads"])
        totals = run["totals"]
        assert totals["moves"] == sum(s["moves"] for s in run["steps"])
        assert totals["lowerBound"] == sum(s["lowerBound"] for s in run["steps"])


def test_compare_runs_the_anchors_on_the_same_steps(capsys: pytest.CaptureFixture[str]) -> None:
    document = simulate_json(capsys, "scale-out", "crash", "--compare", *SMALL)
    for scenario in document["scenarios"]:
        runs = scenario["runs"]
        assert [r["strategy"] for r in runs] == list(COMPARE)
        assert [r["spec"] for r in runs] == [dict(s) for s in COMPARE.values()]
        events = {tuple(s["event"] for s in r["steps"]) for r in runs}
        assert len(events) == 1


def test_strategy_as_name_or_json_spec(capsys: pytest.CaptureFixture[str]) -> None:
    by_name = simulate_json(capsys, "scale-in", "--strategy", "LeastShards", *SMALL)
    assert by_name["scenarios"][0]["runs"][0]["spec"] == {"name": "LeastShards"}
    spec = {"name": "ConsistentHashing", "virtualNodes": 50}
    by_spec = simulate_json(capsys, "scale-in", "--strategy", json.dumps(spec), *SMALL)
    assert by_spec["scenarios"][0]["runs"][0]["spec"] == spec


def test_same_seed_same_output_other_seed_other_crash(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["crash", "hot-key", "grains", *SMALL]
    first = simulate_json(capsys, *args, "--seed", "5")
    assert simulate_json(capsys, *args, "--seed", "5") == first
    other = simulate_json(capsys, *args, "--seed", "6")
    assert other["scenarios"] != first["scenarios"]


def test_text_table_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "scale-out", "grains", "--compare", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "== scale-out: 40 units, 4 -> 6 members, one joins per step (seed 0) ==" in out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("step"))
    for column in ("event", "strategy", "members", "max/mean", "moves", "lb", "rounds", "time"):
        assert column in header.split()
    joined = next(line for line in lines if "worker-4 joins" in line)
    assert joined.split()[:4] == ["1", "worker-4", "joins", "Balanced"]
    for label in COMPARE:
        assert any(line.lstrip().startswith(label) and "moves" in line for line in lines)
    assert "== grains:" in out
    assert all(label in out for label in GRAIN_STRATEGIES)


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is part of the dev install")
    path = tmp_path / "run.png"
    assert main(["simulate", "scale-out", "zipf", "grains", "--plot", str(path), *SMALL]) == 0
    assert f"plot written to {path}" in capsys.readouterr().out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_member_loads_follow_a_scale_out(capsys: pytest.CaptureFixture[str]) -> None:
    """32 units on 4 pods, then a fifth joins: every pod holds its floor-or-ceiling share of the
    32 (6 or 7), and the start is 8 each."""
    (scenario,) = simulate_json(
        capsys, "scale-out", "--units", "32", "--members", "4", "--steps", "1"
    )["scenarios"]
    (run,) = scenario["runs"]
    assert run["initial"]["memberLoads"] == {f"worker-{i}": 8.0 for i in range(4)}
    (step,) = run["steps"]
    after = step["memberLoads"]
    assert set(after) == {f"worker-{i}": 0 for i in range(5)}.keys()
    assert sum(after.values()) == 32
    assert set(after.values()) <= {6.0, 7.0}


def test_member_loads_sum_to_the_total_load(capsys: pytest.CaptureFixture[str]) -> None:
    (scenario,) = simulate_json(capsys, "hot-key", *SMALL)["scenarios"]
    for row in scenario["runs"][0]["steps"]:
        assert row["stranded"] == 0
        # max/mean of these loads is the step's load max/mean (all members eligible here)
        loads = list(row["memberLoads"].values())
        mean = sum(loads) / len(loads)
        assert max(loads) / mean == pytest.approx(row["loadMaxMean"], rel=1e-4)


def test_plot_members_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is part of the dev install")
    path = tmp_path / "members.png"
    assert main(["simulate", "scale-out", "--plot-members", str(path), *SMALL]) == 0
    assert f"plot written to {path}" in capsys.readouterr().out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_members_of_grains_alone_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is part of the dev install")
    path = tmp_path / "members.png"
    assert main(["simulate", "grains", "--plot-members", str(path), *SMALL]) == 2
    assert "the grains scenario has none" in capsys.readouterr().err


def test_plot_without_matplotlib_fails_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "run.png"
    assert main(["simulate", "--plot", str(path), *SMALL]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pip install 'apportion[plot]'" in captured.err
    assert not path.exists()


def test_unwritable_plot_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is part of the dev install")
    path = tmp_path / "missing-dir" / "run.png"
    assert main(["simulate", "scale-out", "--plot", str(path), *SMALL]) == 2
    assert f"cannot write {path}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["spike"], "unknown scenario 'spike' (known: scale-out, scale-in, crash"),
        (["--units", "0"], "--units must be >= 1, got 0"),
        (["--members", "-1"], "--members must be >= 1, got -1"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--interval", "0"], "--interval must be > 0"),
        (["--strategy", "Nope"], "unknown allocation strategy 'Nope'"),
        (["--strategy", "{not json"], "--strategy is not valid JSON"),
        (["--strategy", '{"virtualNodes": 3}'], 'must be an object with a "name"'),
        (["--strategy", '{"name": "Balanced", "tolerence": 0.1}'], "unknown option(s) tolerence"),
        (["scale-in", "--members", "3", "--steps", "3"], "would remove every one of 3 member(s)"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("apportion simulate: ")
    assert message in captured.err


def test_usage_errors_are_argparse_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--compare", "--strategy", "Balanced"], ["--units", "many"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["simulate", *args])
        assert exit_info.value.code == 2
        assert "usage: apportion simulate" in capsys.readouterr().err


def test_default_run_as_a_process() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "apportion", "simulate"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for name in SCENARIO_NAMES:
        assert f"== {name}: " in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "apportion", "simulate", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert "unknown scenario 'nope'" in bad.stderr
