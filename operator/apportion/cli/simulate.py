"""`apportion simulate`: run placement scenarios step by step and print how strategies fare
(docs/simulate.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apportion.engine.grains import SimulationResult
    from apportion.engine.scenarios import Run, Scenario

EXIT_BAD_INPUT = 2
PROG = "apportion simulate"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run placement scenarios and print balance, moves and rounds per step",
        description="Runs scenarios (default: all) through unit allocation strategies and prints, "
        "per step: members, max/mean (unit counts, and load when the scenario has loads), moves "
        "against the lower bound, rounds until the strategy stops moving and their simulated "
        "time; the grains scenario prints max/mean activations per grain strategy. Scenarios: "
        "scale-out, scale-in, crash, rolling-update, zipf, drift, hot-key, split-merge, grains.",
    )
    parser.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help="scenarios to run (default: all)"
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--strategy",
        metavar="NAME",
        help="allocation strategy: a name (default Balanced) or a JSON spec like "
        '\'{"name": "Balanced", "tolerance": "Tight"}\'',
    )
    which.add_argument(
        "--compare",
        action="store_true",
        help="run Balanced against the anchors: Akka's LeastShards and ConsistentHashing, a "
        "Dapr ring, Orleans mod-n hash placement and random placement",
    )
    parser.add_argument("--units", type=int, default=1000, metavar="N", help="units (default 1000)")
    parser.add_argument(
        "--members", type=int, default=10, metavar="N", help="members at the start (default 10)"
    )
    parser.add_argument(
        "--steps", type=int, metavar="K", help="steps per scenario (default: per scenario)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time between rebalance rounds (default 10, Akka's rebalance-interval)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw max/mean and cumulative moves per step (needs matplotlib: apportion[plot])",
    )
    parser.add_argument(
        "--plot-members",
        metavar="FILE.png",
        help="draw each member's load (or units) after every step, per scenario, for the "
        "first strategy (needs matplotlib)",
    )
    parser.set_defaults(func=run)


class _BadInput(Exception):
    pass


def _strategies(args: argparse.Namespace) -> dict[str, Mapping[str, Any]]:
    from apportion.engine.allocation import AllocationError, make_strategy
    from apportion.engine.scenarios import COMPARE

    if args.compare:
        return dict(COMPARE)
    text = args.strategy or "Balanced"
    spec: Any = {"name": text}
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as exc:
            raise _BadInput(f"--strategy is not valid JSON: {exc}") from None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _BadInput('--strategy JSON must be an object with a "name"')
    try:
        make_strategy(spec)
    except AllocationError as exc:
        raise _BadInput(f"--strategy: {exc}") from None
    return {spec["name"]: spec}


def _check(args: argparse.Namespace) -> list[str]:
    from apportion.engine.scenarios import SCENARIO_NAMES

    for flag in ("units", "members", "steps"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise _BadInput(f"--{flag} must be >= 1, got {value}")
    if not args.interval > 0:
        raise _BadInput(f"--interval must be > 0, got {args.interval}")
    unknown = [s for s in args.scenarios if s not in SCENARIO_NAMES]
    if unknown:
        raise _BadInput(f"unknown scenario {unknown[0]!r} (known: {', '.join(SCENARIO_NAMES)})")
    return list(dict.fromkeys(args.scenarios)) or list(SCENARIO_NAMES)


def run(args: argparse.Namespace) -> int:
    from apportion.engine.scenarios import (
        GRAIN_SCENARIO,
        ScenarioError,
        default_steps,
        drive,
        grain_activations,
        make_scenario,
    )

    try:
        names = _check(args)
        strategies = _strategies(args)
        if args.plot is not None or args.plot_members is not None:
            _need_matplotlib()
        results: list[dict[str, Any]] = []
        for name in names:
            if name == GRAIN_SCENARIO:
                steps = args.steps or default_steps(name, args.members)
                sims = grain_activations(
                    activations=args.units, members=args.members, steps=steps, seed=args.seed
                )
                results.append(_grains_json(args, steps, sims))
                continue
            scenario = make_scenario(
                name, units=args.units, members=args.members, steps=args.steps, seed=args.seed
            )
            runs = [
                drive(scenario, spec, label=label, interval=args.interval)
                for label, spec in strategies.items()
            ]
            results.append(_allocation_json(scenario, strategies, runs))
    except (_BadInput, ScenarioError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    document = {
        "seed": args.seed,
        "units": args.units,
        "members": args.members,
        "interval": args.interval,
        "scenarios": results,
    }
    if args.json:
        json.dump(document, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        _print_text(document)
    for path, draw in ((args.plot, _plot), (args.plot_members, _plot_members)):
        if path is None:
            continue
        try:
            draw(document, path)
        except (OSError, ValueError) as exc:
            print(f"{PROG}: cannot write {path}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not args.json:
            print(f"plot written to {path}")
    return 0


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise _BadInput(
            "--plot needs matplotlib, which is not installed: pip install 'apportion[plot]'"
        ) from None


# --- JSON -------------------------------------------------------------------------------------


def _allocation_json(
    scenario: Scenario, strategies: Mapping[str, Mapping[str, Any]], runs: Sequence[Run]
) -> dict[str, Any]:
    return {
        "name": scenario.name,
        "kind": "allocation",
        "description": scenario.description,
        "loads": scenario.initial.loads is not None,
        "lowerBound": "forced moves" if scenario.initial.loads is not None else "count floor",
        "runs": [{"spec": dict(strategies[run.strategy]), **run.to_json()} for run in runs],
    }


def _grains_json(
    args: argparse.Namespace, steps: int, sims: Sequence[SimulationResult]
) -> dict[str, Any]:
    return {
        "name": "grains",
        "kind": "grains",
        "description": f"{args.units} activations arriving over {steps} s on {args.members} "
        "members, every member placing, statistics published every 1 s",
        "runs": [sim.to_dict() for sim in sims],
    }


# --- Text -------------------------------------------------------------------------------------


def _print_text(document: Mapping[str, Any]) -> None:
    first = True
    for scenario in document["scenarios"]:
        if not first:
            print()
        first = False
        print(f"== {scenario['name']}: {scenario['description']} (seed {document['seed']}) ==")
        if scenario["kind"] == "grains":
            _print_grains(scenario)
        else:
            _print_allocation(scenario)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _print_allocation(scenario: Mapping[str, Any]) -> None:
    runs = scenario["runs"]
    label_width = max(len("strategy"), *(len(r["strategy"]) for r in runs))
    events = [runs[0]["initial"]] + runs[0]["steps"]
    event_width = max(len("event"), *(len(e["event"]) for e in events))
    header = (
        f"{'step':>4}  {'event':<{event_width}}  {'strategy':<{label_width}}  {'members':>7}  "
        f"{'max/mean':>8}  {'load':>6}  {'moves':>5}  {'lb':>5}  {'rounds':>6}  {'time':>5}  "
        f"{'stranded':>8}  note"
    )
    print(header)
    for k, event in enumerate(events):
        for j, run in enumerate(runs):
            row = run["initial"] if k == 0 else run["steps"][k - 1]
            members = (
                str(row["members"])
                if row["eligible"] == row["members"]
                else f"{row['eligible']}/{row['members']}"
            )
            note = "; ".join(row["notes"])
            if not row["converged"] and not note:
                note = "not converged"
            step = f"{k:>4}  {event['event']:<{event_width}}" if j == 0 else " " * (6 + event_width)
            print(
                f"{step}  {run['strategy']:<{label_width}}  {members:>7}  "
                f"{_ratio(row['maxMean']):>8}  {_ratio(row['loadMaxMean']):>6}  "
                f"{row['moves']:>5}  {row['lowerBound']:>5}  {row['rounds']:>6}  "
                f"{_seconds(row['seconds']):>5}  {row['stranded']:>8}  {note}".rstrip()
            )
    print(f"lb: {scenario['lowerBound']}; totals over the steps (start excluded):")
    for run in runs:
        totals = run["totals"]
        ratio = ""
        if totals["moves"] >= totals["lowerBound"] > 0:
            ratio = f" ({totals['moves'] / totals['lowerBound']:.2f}x lb)"
        elif scenario["lowerBound"] == "count floor" and totals["moves"] < totals["lowerBound"]:
            # Fewer moves than the bound: the strategy left units off the floor.
            ratio = " (below lb: some step ended off the floor)"
        print(
            f"  {run['strategy']:<{label_width}}  moves {totals['moves']} vs lb "
            f"{totals['lowerBound']}{ratio}, rounds {totals['rounds']}, "
            f"time {_seconds(totals['seconds'])}"
        )


def _print_grains(scenario: Mapping[str, Any]) -> None:
    runs = scenario["runs"]
    widths = [max(8, len(r["label"])) for r in runs]
    print("max/mean activations (true counts) at each statistics publish, then at the end:")
    print(
        f"{'time':>5}  {'active':>6}  "
        + "  ".join(f"{r['label']:>{w}}" for r, w in zip(runs, widths, strict=True))
    )
    for k, step in enumerate(runs[0]["steps"][1:], start=1):
        cells = "  ".join(
            f"{r['steps'][k]['maxOverMean']:>{w}.3f}" if k < len(r["steps"]) else f"{'-':>{w}}"
            for r, w in zip(runs, widths, strict=True)
        )
        print(f"{_seconds(step['time']):>5}  {step['active']:>6}  {cells}")
    cells = "  ".join(f"{r['maxOverMean']:>{w}.3f}" for r, w in zip(runs, widths, strict=True))
    print(f"{'end':>5}  {sum(runs[0]['counts'].values()):>6}  {cells}")
    failed = [f"{r['label']} {r['failures']}" for r in runs if r["failures"]]
    if failed:
        print("failed placements: " + ", ".join(failed))


# --- Plot -------------------------------------------------------------------------------------


def _plot(document: Mapping[str, Any], path: str) -> None:
    scenarios = document["scenarios"]
    fig, axes = _figure(len(scenarios), 2, height=3.2)
    for (left, right), scenario in zip(axes, scenarios, strict=True):
        if scenario["kind"] == "grains":
            _plot_grains(left, right, scenario)
        else:
            _plot_allocation(left, right, scenario)
    _save(fig, document, path)


def _plot_members(document: Mapping[str, Any], path: str) -> None:
    """One panel per unit scenario: each member's load (or unit count) after every step, as a
    user would watch `kubectl get partitionset -o jsonpath={.status.memberUnits}` over time."""
    from matplotlib.ticker import MaxNLocator

    scenarios = [s for s in document["scenarios"] if s["kind"] == "allocation"]
    if not scenarios:
        raise ValueError("--plot-members draws unit scenarios; the grains scenario has none")
    fig, axes = _figure(len(scenarios), 1, height=3.4)
    for (ax,), scenario in zip(axes, scenarios, strict=True):
        run = scenario["runs"][0]
        rows = [run["initial"], *run["steps"]]
        members = sorted({m for r in rows for m in r["memberLoads"]}, key=_natural)
        for member in members:
            ax.plot(
                [r["step"] for r in rows],
                [r["memberLoads"].get(member, float("nan")) for r in rows],
                marker="o",
                label=member,
            )
        what = "load" if scenario["loads"] else "units"
        ax.set_title(f"{scenario['name']} ({run['strategy']}): {what} per member after each step")
        ax.set_xlabel("step")
        ax.set_ylabel(what)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    _save(fig, document, path)


def _natural(name: str) -> tuple[str, int]:
    """worker-10 after worker-9."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _figure(rows: int, columns: int, *, height: float) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, columns, figsize=(12, height * rows), squeeze=False)


def _save(fig: Any, document: Mapping[str, Any], path: str) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(
        f"apportion simulate: {document['units']} units, {document['members']} members, "
        f"seed {document['seed']}"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    try:
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _plot_allocation(left: Any, right: Any, scenario: Mapping[str, Any]) -> None:
    from matplotlib.ticker import MaxNLocator

    loads = scenario["loads"]
    for run in scenario["runs"]:
        rows = [run["initial"], *run["steps"]]
        steps = [r["step"] for r in rows]
        ratio = [r["loadMaxMean"] if loads else r["maxMean"] for r in rows]
        (line,) = left.plot(steps, ratio, marker="o", label=run["strategy"])
        cumulative = [0]
        for r in run["steps"]:
            cumulative.append(cumulative[-1] + r["moves"])
        right.plot(steps, cumulative, marker="o", color=line.get_color(), label=run["strategy"])
    first = scenario["runs"][0]
    bound = [0]
    for r in first["steps"]:
        bound.append(bound[-1] + r["lowerBound"])
    right.plot(
        range(len(bound)),
        bound,
        linestyle="--",
        color="black",
        label=f"lower bound ({first['strategy']})",
    )
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_title(f"{scenario['name']}: max/mean {'load' if loads else 'units'} after each step")
    right.set_title(f"{scenario['name']}: cumulative moves ({scenario['lowerBound']} bound)")
    for ax in (left, right):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    right.set_ylim(bottom=0, top=max(1.0, right.get_ylim()[1]))
    right.legend(fontsize="small", loc="upper left")


def _plot_grains(left: Any, right: Any, scenario: Mapping[str, Any]) -> None:
    runs = scenario["runs"]
    colors = []
    for run in runs:
        steps = run["steps"][1:]
        (line,) = left.plot(
            [s["time"] for s in steps],
            [s["maxOverMean"] for s in steps],
            marker="o",
            label=run["label"],
        )
        colors.append(line.get_color())
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_title("grains: max/mean activations at each statistics publish")
    left.set_xlabel("time (s)")
    left.grid(alpha=0.3)
    # The bars name the strategies in the lines' colours: no legend over the lines.
    finals = [r["maxOverMean"] for r in runs]
    right.barh([r["label"] for r in runs], finals, color=colors)
    right.invert_yaxis()
    right.set_xlim(left=0.9, right=max(finals) + 0.1)
    right.axvline(1.0, color="grey", linewidth=0.8)
    right.set_title("grains: max/mean activations at the end")
    right.grid(alpha=0.3, axis="x")
