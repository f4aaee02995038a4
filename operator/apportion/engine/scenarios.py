"""Scenarios: fleets and loads that change step by step, and the driver that plans through them.

Used by `apportion simulate`, the benchmarks and the tests. Pure and seeded: a scenario is a
start :class:`World` (members, units, optional loads) and a list of :class:`Step` worlds; the
driver carries one strategy's assignment from world to world, planning round after round until
the strategy stops moving (Akka's LeastShards needs several rebalance rounds, Balanced one), and
measures each step against the same yardsticks for every strategy:

- ``max/mean``: the most loaded eligible member's unit count / capacity over the mean (and the
  same by load when the world has loads);
- ``lower bound``: the fewest moves any strategy needs — without loads, the moves that bring
  counts to the floor (units of gone, not-ready or draining members plus each member's surplus
  over its Hamilton quota); with loads, the forced moves only (units of members that may not
  keep them), since the least-moves best load balance is NP-hard to know;
- ``rounds`` and simulated time: the first round runs on the event, each further round one
  rebalance interval later (Akka's rebalance-interval, 10 s).

Grain scenarios run :func:`apportion.engine.grains.simulate_activations` for each grain strategy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from apportion.engine.allocation import AllocationRequest, AllocationStrategy, Member, Plan
from apportion.engine.allocation.plan_builder import (
    count_lower_bound,
    count_ratio,
    index_request,
    target_members,
)
from apportion.engine.baselines import ANCHORS, make_anchor
from apportion.engine.grains import (
    DEFAULT_ROLE_LABEL,
    ActivationScenario,
    SimulationResult,
    simulate_activations,
)

__all__ = [
    "ALLOCATION_SCENARIOS",
    "COMPARE",
    "GRAIN_SCENARIO",
    "GRAIN_STRATEGIES",
    "SCENARIO_NAMES",
    "Run",
    "Scenario",
    "ScenarioError",
    "Step",
    "StepResult",
    "World",
    "crash",
    "default_steps",
    "drifting_load",
    "drive",
    "grain_activations",
    "hot_key",
    "make_scenario",
    "rolling_update",
    "run_steps",
    "scale_in",
    "scale_out",
    "zipf_load",
]


class ScenarioError(ValueError):
    """Scenario parameters that make no sense; the message says which and why."""


@dataclass(frozen=True, slots=True)
class World:
    """The fleet and the work at one moment: members (in order), units (in order) and, when
    measured, each unit's load."""

    members: tuple[Member, ...]
    units: tuple[str, ...]
    loads: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One event (``"worker-10 joins"``) and the world after it. ``parents``: when the event
    changes the unit count (online resharding), each new unit's units before it; a new unit
    starts where its parents are (a merge first gathers them where most of them are)."""

    event: str
    world: World
    parents: Mapping[str, tuple[str, ...]] | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    initial: World
    steps: tuple[Step, ...]


# --- Generators ----------------------------------------------------------------------------------


def _check(units: int, members: int, steps: int) -> None:
    for name, value in (("units", units), ("members", members), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScenarioError(f"{name} must be an integer >= 1, got {value!r}")


def member_name(i: int) -> str:
    """StatefulSet pod names: ``worker-0``, ``worker-1``, ..."""
    return f"worker-{i}"


def unit_names(units: int) -> tuple[str, ...]:
    width = len(str(units - 1))
    return tuple(f"u-{j:0{width}d}" for j in range(units))


def _fleet(members: int, version: str = "1") -> tuple[Member, ...]:
    return tuple(Member(member_name(i), version=version) for i in range(members))


def _set(fleet: Sequence[Member], name: str, **changes: Any) -> tuple[Member, ...]:
    return tuple(replace(m, **changes) if m.name == name else m for m in fleet)


def _without(fleet: Sequence[Member], name: str) -> tuple[Member, ...]:
    return tuple(m for m in fleet if m.name != name)


def _loads(units: Sequence[str], values: np.ndarray) -> Mapping[str, float]:
    return MappingProxyType(dict(zip(units, values.tolist(), strict=True)))


def scale_out(units: int = 1000, members: int = 10, steps: int = 3, seed: int = 0) -> Scenario:
    """One member joins per step (the next StatefulSet ordinal)."""
    _check(units, members, steps)
    names = unit_names(units)
    fleet = _fleet(members)
    out = []
    for k in range(steps):
        fleet = (*fleet, Member(member_name(members + k), version="1"))
        out.append(Step(f"{member_name(members + k)} joins", World(fleet, names)))
    return Scenario(
        "scale-out",
        f"{units} units, {members} -> {members + steps} members, one joins per step",
        World(_fleet(members), names),
        tuple(out),
    )


def scale_in(units: int = 1000, members: int = 10, steps: int = 3, seed: int = 0) -> Scenario:
    """One member leaves per step, gracefully: the highest ordinal drains (its pod is
    terminating, it may still hand off) and the one that drained before it is gone."""
    _check(units, members, steps)
    if steps >= members:
        raise ScenarioError(
            f"scale-in: {steps} step(s) would remove every one of {members} member(s); "
            "use fewer steps or more members"
        )
    names = unit_names(units)
    fleet = _fleet(members)
    out = []
    previous: str | None = None
    for k in range(steps):
        leaving = member_name(members - 1 - k)
        fleet = _set(fleet, leaving, draining=True)
        event = f"{leaving} drains"
        if previous is not None:
            fleet = _without(fleet, previous)
            event = f"{previous} gone, {event}"
        out.append(Step(event, World(fleet, names)))
        previous = leaving
    return Scenario(
        "scale-in",
        f"{units} units, {members} -> {members - steps} members, one drains then leaves per step",
        World(_fleet(members), names),
        tuple(out),
    )


def crash(units: int = 1000, members: int = 10, steps: int = 3, seed: int = 0) -> Scenario:
    """A member crashes: it stops being ready, then its pod is gone, then a replacement with
    the same name comes back; every three steps another (seeded random) member crashes."""
    _check(units, members, steps)
    rng = np.random.default_rng(seed)
    names = unit_names(units)
    fleet = _fleet(members)
    out = []
    victim = ""
    for k in range(steps):
        phase = k % 3
        if phase == 0:
            victim = member_name(int(rng.integers(members)))
            fleet = _set(fleet, victim, ready=False)
            event = f"{victim} not ready"
        elif phase == 1:
            fleet = _without(fleet, victim)
            event = f"{victim} gone"
        else:
            position = int(victim.rsplit("-", 1)[1])
            fleet = (*fleet[:position], Member(victim, version="1"), *fleet[position:])
            event = f"{victim} back"
        out.append(Step(event, World(fleet, names)))
    return Scenario(
        "crash",
        f"{units} units on {members} members; a member crashes (not ready, gone, replaced)",
        World(_fleet(members), names),
        tuple(out),
    )


def rolling_update(
    units: int = 1000, members: int = 10, steps: int | None = None, seed: int = 0
) -> Scenario:
    """A StatefulSet rolling update, highest ordinal first: each pod terminates (drains) and
    comes back ready at the new app version; two steps per pod (default: the whole fleet)."""
    steps = 2 * members if steps is None else steps
    _check(units, members, steps)
    names = unit_names(units)
    fleet = _fleet(members)
    out = []
    for k in range(steps):
        round_, position = divmod(k // 2, members)
        pod = member_name(members - 1 - position)
        version = str(2 + round_)
        if k % 2 == 0:
            fleet = _set(fleet, pod, draining=True)
            event = f"{pod} terminating"
        else:
            fleet = _set(fleet, pod, draining=False, version=version)
            event = f"{pod} ready at v{version}"
        out.append(Step(event, World(fleet, names)))
    return Scenario(
        "rolling-update",
        f"{units} units on {members} members; rolling update, one pod at a time",
        World(_fleet(members), names),
        tuple(out),
    )


def zipf_ranks(units: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    """Zipf loads ``1 / rank^exponent`` over a random ranking of the units, mean 1."""
    weights = 1.0 / np.arange(1, units + 1, dtype=float) ** exponent
    loads = weights[rng.permutation(units)]
    scaled: np.ndarray = loads * (units / loads.sum())
    return scaled


def zipf_load(
    units: int = 1000,
    members: int = 10,
    steps: int = 3,
    seed: int = 0,
    *,
    exponent: float = 1.1,
    noise: float = 0.1,
) -> Scenario:
    """Loads start even, then turn Zipf-skewed (exponent 1.1) and are measured again each step
    with multiplicative log-normal measurement noise (``noise``: its sigma)."""
    _check(units, members, steps)
    rng = np.random.default_rng(seed)
    names = unit_names(units)
    fleet = _fleet(members)
    base = zipf_ranks(units, exponent, rng)
    out = [Step(f"Zipf({exponent:g}) load appears", World(fleet, names, _loads(names, base)))]
    for _ in range(1, steps):
        measured = base * rng.lognormal(-(noise**2) / 2, noise, units)
        out.append(
            Step(
                f"re-measured (noise sigma={noise:g})", World(fleet, names, _loads(names, measured))
            )
        )
    return Scenario(
        "zipf",
        f"{units} units on {members} members; Zipf({exponent:g}) loads, noisy measurements",
        World(fleet, names, _loads(names, np.ones(units))),
        tuple(out),
    )


def drifting_load(
    units: int = 1000,
    members: int = 10,
    steps: int = 3,
    seed: int = 0,
    *,
    sigma: float = 0.5,
    persistence: float = 0.9,
) -> Scenario:
    """Log-normal loads (log-load spread ``sigma``) that drift: each step the log-load follows
    an AR(1) process with coefficient ``persistence``, so loads wander while their spread stays
    ``sigma`` (persistence 0 is pure noise around the mean)."""
    _check(units, members, steps)
    if not 0 <= persistence < 1 or sigma < 0:
        raise ScenarioError("drifting load needs sigma >= 0 and 0 <= persistence < 1")
    rng = np.random.default_rng(seed)
    names = unit_names(units)
    fleet = _fleet(members)
    log = rng.normal(0.0, sigma, units)
    start = World(fleet, names, _loads(names, np.exp(log - sigma**2 / 2)))
    out = []
    shock = sigma * math.sqrt(1 - persistence**2)
    for _ in range(steps):
        log = persistence * log + rng.normal(0.0, shock, units)
        loads = _loads(names, np.exp(log - sigma**2 / 2))
        out.append(
            Step(f"loads drift (sigma={sigma:g}, rho={persistence:g})", World(fleet, names, loads))
        )
    return Scenario(
        "drift",
        f"{units} units on {members} members; log-normal loads drifting (sigma={sigma:g})",
        start,
        tuple(out),
    )


HEAT = (0.5, 1.0, 2.0, 4.0, 1.0, 0.1)
"""The hot unit's load per step, in multiples of the mean member load (heats up, cools down)."""


def hot_key(units: int = 1000, members: int = 10, steps: int = 6, seed: int = 0) -> Scenario:
    """Even loads (±5 % noise) while one (seeded random) unit heats up to several times a
    member's mean load and cools down again (:data:`HEAT`, repeated)."""
    _check(units, members, steps)
    rng = np.random.default_rng(seed)
    names = unit_names(units)
    fleet = _fleet(members)
    hot = int(rng.integers(units))
    start = World(fleet, names, _loads(names, rng.lognormal(0.0, 0.05, units)))
    out = []
    for k in range(steps):
        loads = rng.lognormal(0.0, 0.05, units)
        others = loads.sum() - loads[hot]
        heat = HEAT[k % len(HEAT)]
        loads[hot] = heat * others / members
        out.append(
            Step(
                f"{names[hot]} at {heat:g}x a member's load",
                World(fleet, names, _loads(names, loads)),
            )
        )
    return Scenario(
        "hot-key",
        f"{units} units on {members} members; one unit heats up and cools down",
        start,
        tuple(out),
    )


def split_merge(units: int = 32, members: int = 4, steps: int = 3, seed: int = 0) -> Scenario:
    """Online resharding under Zipf-skewed load (each key keeps its load, so a child carries its
    share of its parent's): a x4 split, two members join, a /2 merge (32 -> 128 -> 64 units on
    4 -> 6 members by default); ``steps`` below 3 stops the story early."""
    _check(units, members, steps)
    rng = np.random.default_rng(seed)
    names = unit_names(units)
    loads = zipf_ranks(units, 1.1, rng)
    fleet = _fleet(members)
    # Per fine unit (4 per original unit), with the noise of keys not splitting evenly.
    fine = np.repeat(loads / 4, 4) * rng.lognormal(0.0, 0.2, 4 * units)
    split_names = unit_names(4 * units)
    merged_names = unit_names(2 * units)
    grown = (*fleet, *(Member(member_name(members + k), version="1") for k in range(2)))
    return Scenario(
        "split-merge",
        f"{units} -> {4 * units} -> {2 * units} units, {members} -> {members + 2} members, "
        "Zipf load",
        World(fleet, names, _loads(names, fine.reshape(units, 4).sum(axis=1))),
        (
            Step(
                f"split x4 to {4 * units} units",
                World(fleet, split_names, _loads(split_names, fine)),
                {c: (names[i // 4],) for i, c in enumerate(split_names)},
            ),
            Step(
                f"{member_name(members)}, {member_name(members + 1)} join",
                World(grown, split_names, _loads(split_names, fine)),
            ),
            Step(
                f"merge /2 to {2 * units} units",
                World(grown, merged_names, _loads(merged_names, fine.reshape(-1, 2).sum(axis=1))),
                {
                    m: (split_names[2 * i], split_names[2 * i + 1])
                    for i, m in enumerate(merged_names)
                },
            ),
        )[:steps],
    )


def _inherit(
    assignment: Assignment, parents: Mapping[str, tuple[str, ...]]
) -> tuple[Assignment, int]:
    """The assignment of the new units of a resharding, and the moves it took: a unit goes where
    most of its parents are (ties: the first parent's), so a split moves nothing and a merge
    moves only the siblings that sat elsewhere (the gathering hand-offs)."""
    where = {unit: member for member, held in assignment.items() for unit in held}
    result: dict[str, list[str]] = {member: [] for member in assignment}
    moves = 0
    for unit, old in parents.items():
        owners = [where[p] for p in old if p in where]
        if not owners:
            continue
        place = max(owners, key=owners.count)
        moves += sum(1 for o in owners if o != place)
        result[place].append(unit)
    return {m: tuple(u) for m, u in result.items()}, moves


ALLOCATION_SCENARIOS: Mapping[str, Callable[..., Scenario]] = MappingProxyType(
    {
        "scale-out": scale_out,
        "scale-in": scale_in,
        "crash": crash,
        "rolling-update": rolling_update,
        "zipf": zipf_load,
        "drift": drifting_load,
        "hot-key": hot_key,
        "split-merge": split_merge,
    }
)
GRAIN_SCENARIO = "grains"
SCENARIO_NAMES = (*ALLOCATION_SCENARIOS, GRAIN_SCENARIO)


def default_steps(name: str, members: int) -> int:
    """Steps a scenario takes when not told: a whole rolling update, one heat cycle, else 3."""
    if name == "rolling-update":
        return 2 * members
    if name == "hot-key":
        return len(HEAT)
    if name == GRAIN_SCENARIO:
        return 5
    return 3


def make_scenario(
    name: str, *, units: int, members: int, steps: int | None = None, seed: int = 0
) -> Scenario:
    """The allocation scenario ``name`` (one of :data:`ALLOCATION_SCENARIOS`)."""
    factory = ALLOCATION_SCENARIOS.get(name)
    if factory is None:
        raise ScenarioError(f"unknown scenario {name!r} (known: {', '.join(SCENARIO_NAMES)})")
    return factory(units, members, default_steps(name, members) if steps is None else steps, seed)


# --- Driver --------------------------------------------------------------------------------------

COMPARE: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {"Balanced": {"name": "Balanced"}, **ANCHORS}
)
"""What ``apportion simulate --compare`` runs: ours, then the anchors
(:data:`apportion.engine.baselines.ANCHORS`): Akka's LeastShards (limits 20/0.1) and
ConsistentHashing (10 virtual nodes), Dapr's placement ring (100 virtual nodes), Orleans mod-n
hash placement and random placement."""

Assignment = Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one strategy did at one step (step 0: the initial placement)."""

    step: int
    event: str
    members: int
    """Members present."""
    eligible: int
    """Members that may take units (ready, not draining, capacity > 0)."""
    units: int
    moves: int
    lower_bound: int
    rounds: int
    """Plans that moved something."""
    converged: bool
    """The last plan said another would move nothing (False: paused, limited or out of rounds)."""
    seconds: float
    """Simulated time from the event to the last round."""
    max_mean: float
    load_max_mean: float | None
    moved_load: float | None
    """Load of the moved units over the total load."""
    stranded: int
    """Units left on members that are not ready, or with no member at all."""
    notes: tuple[str, ...]
    """The strategy's reasons (rebalance paused, hot unit, ...) from the plans that moved, or
    from the one plan when none moved; first seen first."""
    member_loads: Mapping[str, float]
    """Per member present, the load of the units it holds after the step (its unit count in
    scenarios without loads): what a per-pod plot over time draws."""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "event": self.event,
            "members": self.members,
            "eligible": self.eligible,
            "units": self.units,
            "moves": self.moves,
            "lowerBound": self.lower_bound,
            "rounds": self.rounds,
            "converged": self.converged,
            "seconds": self.seconds,
            "maxMean": _round(self.max_mean),
            "loadMaxMean": _round(self.load_max_mean),
            "movedLoad": _round(self.moved_load),
            "stranded": self.stranded,
            "notes": list(self.notes),
            "memberLoads": {m: _round(v) for m, v in self.member_loads.items()},
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


@dataclass(frozen=True, slots=True)
class Run:
    """One strategy through one scenario."""

    scenario: str
    strategy: str
    initial: StepResult
    steps: tuple[StepResult, ...]
    assignment: Assignment
    """After the last step."""

    @property
    def moves(self) -> int:
        return sum(s.moves for s in self.steps)

    @property
    def lower_bound(self) -> int:
        return sum(s.lower_bound for s in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "initial": self.initial.to_json(),
            "steps": [s.to_json() for s in self.steps],
            "totals": {
                "moves": self.moves,
                "lowerBound": self.lower_bound,
                "rounds": sum(s.rounds for s in self.steps),
                "seconds": sum(s.seconds for s in self.steps),
            },
        }


def _strategy(strategy: AllocationStrategy | Mapping[str, Any]) -> AllocationStrategy:
    return make_anchor(strategy) if isinstance(strategy, Mapping) else strategy


def run_steps(
    scenario: Scenario,
    strategy: AllocationStrategy | Mapping[str, Any],
    *,
    max_rounds: int = 100,
    interval: float = 10.0,
) -> Iterator[tuple[StepResult, Assignment, tuple[str, ...]]]:
    """Places the initial world, then plans through each step; yields each step's result with
    the assignment and the units no member could take after it (step 0 first).

    Each step plans until a plan moves nothing or ``max_rounds`` plans have moved something.
    """
    if max_rounds < 1:
        raise ScenarioError(f"max_rounds must be >= 1, got {max_rounds}")
    planner = _strategy(strategy)
    assignment: Assignment = {}
    worlds = [Step("start", scenario.initial), *scenario.steps]
    for k, step in enumerate(worlds):
        world = step.world
        gathered = 0
        if step.parents is not None:
            assignment, gathered = _inherit(assignment, step.parents)
        request = AllocationRequest(world.units, world.members, assignment, world.loads)
        state = index_request(request)
        targets, _ = target_members(state)
        # With loads only forced moves are a bound every strategy shares (module docstring).
        quotas = None if world.loads is None else [state.count(i) for i in targets]
        # Nothing can move where no member can take units.
        lower_bound = count_lower_bound(state, targets, quotas) if targets else 0
        moves, rounds = gathered, 0
        moved_load = 0.0
        notes: dict[str, None] = {}
        plan: Plan | None = None
        while rounds < max_rounds:
            plan = planner.plan(request)
            if not plan.moves:
                if not rounds:  # a plan that only confirms the last round has nothing to add
                    notes.update(dict.fromkeys(plan.quality.reasons))
                break
            notes.update(dict.fromkeys(plan.quality.reasons))
            rounds += 1
            moves += len(plan.moves)
            if world.loads is not None:
                moved_load += math.fsum(world.loads.get(m.unit, 0.0) for m in plan.moves)
            request = replace(request, assignment=plan.assignment)
        assert plan is not None
        assignment, unassigned = plan.assignment, plan.unassigned
        result = _measure(world, assignment, unassigned)
        total_load = math.fsum(world.loads.values()) if world.loads is not None else 0.0
        yield (
            StepResult(
                step=k,
                event=step.event,
                members=len(world.members),
                eligible=result[0],
                units=len(world.units),
                moves=moves,
                lower_bound=lower_bound,
                rounds=rounds,
                converged=plan.quality.converged and not plan.moves,
                seconds=max(0, rounds - 1) * interval,
                max_mean=result[1],
                load_max_mean=result[2],
                moved_load=None
                if world.loads is None
                else (moved_load / total_load if total_load else 0.0),
                stranded=result[3],
                notes=tuple(notes),
                member_loads=result[4],
            ),
            assignment,
            unassigned,
        )


def _measure(
    world: World, assignment: Assignment, unassigned: Sequence[str]
) -> tuple[int, float, float | None, int, dict[str, float]]:
    """Eligible members, count max/mean, load max/mean, stranded units and per-member load (or
    count) of an assignment."""
    state = index_request(AllocationRequest(world.units, world.members, assignment, world.loads))
    targets = [i for i, m in enumerate(state.members) if m.eligible]
    counts = [state.count(i) for i in range(len(state.members))]
    held = {
        m.name: math.fsum(world.loads.get(u, 0.0) for u in state.held[i])
        if world.loads is not None
        else float(counts[i])
        for i, m in enumerate(state.members)
    }
    stranded = len(unassigned) + sum(counts[i] for i, m in enumerate(state.members) if not m.ready)
    load_ratio = None
    if world.loads is not None:
        loads = world.loads
        capacity = math.fsum(state.members[i].capacity for i in targets)
        total = math.fsum(loads.get(u, 0.0) for u in world.units)
        mean = total / capacity if targets else 0.0
        if mean > 0:  # not when the mean of tiny loads underflows
            load_ratio = (
                max(
                    math.fsum(loads.get(u, 0.0) for u in state.held[i]) / state.members[i].capacity
                    for i in targets
                )
                / mean
            )
        else:
            load_ratio = 0.0
    return len(targets), count_ratio(counts, state, targets), load_ratio, stranded, held


def drive(
    scenario: Scenario,
    strategy: AllocationStrategy | Mapping[str, Any],
    *,
    label: str | None = None,
    max_rounds: int = 100,
    interval: float = 10.0,
) -> Run:
    """Runs ``strategy`` (an instance, or a spec for ``make_strategy`` or of an anchor) through
    ``scenario``."""
    if label is None:
        label = (
            str(strategy.get("name")) if isinstance(strategy, Mapping) else type(strategy).__name__
        )
    results: list[StepResult] = []
    final: Assignment = {}
    for result, assignment, _ in run_steps(
        scenario, strategy, max_rounds=max_rounds, interval=interval
    ):
        results.append(result)
        final = assignment
    return Run(scenario.name, label, results[0], tuple(results[1:]), final)


# --- Grains --------------------------------------------------------------------------------------

GRAIN_ROLE = "worker"
GRAIN_STRATEGIES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        "Random": {"name": "Random"},
        "PreferLocal": {"name": "PreferLocal"},
        "HashBased": {"name": "HashBased"},
        "ConsistentHashBased": {"name": "ConsistentHashBased"},
        "ActivationCountBased": {"name": "ActivationCountBased"},
        "StatelessWorker": {"name": "StatelessWorker"},
        "SiloRoleBased": {"name": "SiloRoleBased", "role": GRAIN_ROLE},
        "ResourceOptimized": {"name": "ResourceOptimized"},
    }
)
"""Every built-in grain strategy; every member carries the role, so SiloRoleBased picks among
all of them."""


def grain_activations(
    *,
    activations: int = 1000,
    members: int = 10,
    steps: int = 5,
    seed: int = 0,
    strategies: Mapping[str, Mapping[str, Any]] = GRAIN_STRATEGIES,
    placers: int | None = None,
) -> tuple[SimulationResult, ...]:
    """``activations`` grains arriving over ``steps`` seconds on ``members`` members, placed
    by every member (default; or ``placers`` of them), statistics published once a second — so
    each placement sees counts up to a second old."""
    _check(activations, members, steps)
    return tuple(
        simulate_activations(
            spec,
            ActivationScenario(
                members=members,
                activations=activations,
                placers=members if placers is None else placers,
                rate=activations / steps,
                publish_interval=1.0,
                seed=seed,
            ),
            labels=lambda _: {DEFAULT_ROLE_LABEL: GRAIN_ROLE},
            label=label,
        )
        for label, spec in strategies.items()
    )
