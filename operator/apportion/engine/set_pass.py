"""One placement pass of a PartitionSet or ShardSet (its status: `apportion.engine.set_status`).

A pass turns what the API server holds — the spec, the published assignment table, the worker
pods (with their acks) and the workload's rollout state — into at most one new table: the
allocation strategy says where every unit should live (`apportion.engine.allocation`), the pass
holds back optional moves (rollout, rebalance interval, moves per round), and the fenced hand-off
(`apportion.engine.handoff.step`) advances every unit one move towards that target. Pure: no I/O,
no clock; `apportion.engine.set_loop` runs it whenever something the controller reads changes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from apportion.api.assignment import (
    Ack,
    AssignmentFormatError,
    AssignmentTable,
    Lineage,
    ResourceRef,
    unit_order,
)
from apportion.api.common import rfc3339, seconds
from apportion.api.pods import WorkerPod
from apportion.api.unitset import KeySchemeName, UnitSetSpec
from apportion.engine.allocation import (
    AllocationError,
    AllocationRequest,
    Member,
    Move,
    Plan,
)
from apportion.engine.allocation.from_spec import move_budget, strategy_for
from apportion.engine.handoff import HandoffDecision, HandoffEvent, Reason, step
from apportion.engine.reshard import Progress, gather_targets, next_lineage, progress, resharded
from apportion.engine.restarts import (
    RestartHold,
    held_target,
    spend_expired,
    stateful_identity,
    track_holds,
)

NEW_REVISION = "1"
OLD_REVISION = "0"
"""Member versions during a rollout: strategies that prefer the newest version (LeastShards, as
Akka) compare these, not revision hashes, which have no order."""


@dataclass(frozen=True, slots=True)
class Rollout:
    """The workload's rollout: while `rolling`, optional moves wait (pauseDuringRollout) and pods
    of revisions other than `new_revision` are older."""

    rolling: bool = False
    new_revision: str | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Problem:
    """Something only the operator can judge is wrong: reported as Degraded and in an Event."""

    reason: str
    message: str


@dataclass(frozen=True)
class PassInput:
    """Everything one pass decides from.

    `pods`: selected worker pods that exist and have not terminated. `departed`: pods that still
    exist and own units in `published` but are no longer selected; they hand their units off as
    draining members would, since their processes may still serve them. `last_round`: when the
    last rebalance round started (Unix seconds), None if never.
    """

    spec: UnitSetSpec
    published: AssignmentTable
    generation: int
    pods: Sequence[WorkerPod]
    now: float
    last_round: float | None = None
    rollout: Rollout = Rollout()
    loads: Mapping[str, float] | None = None
    departed: Sequence[WorkerPod] = ()
    desired_members: int | None = None
    """The workload's replicas (workloadRef), which the first placement waits for."""
    created: float | None = None
    """When the set was created (Unix seconds): the start of `startup.timeout`."""
    releases_known: Mapping[str, float] | None = None
    """Releasing unit → when this operator knew the release was published; a release times
    out only `handoffTimeout` after it (`apportion.engine.handoff.step`). None: from `since`."""
    restart_holds: Mapping[str, RestartHold] = field(default_factory=dict)
    """The holds of the previous pass (`apportion.engine.restarts`), by member name."""


@dataclass(frozen=True)
class PassResult:
    """What a pass decided.

    `decision` is None when nothing may be decided (no members, an unusable strategy): the
    published table stands. `plan`: the strategy's plan before moves were held back; `kept`:
    the moves this pass makes; `held`: optional moves it leaves for a later round, and why.
    """

    decision: HandoffDecision | None
    plan: Plan | None = None
    kept: tuple[Move, ...] = ()
    held: int = 0
    hold_reason: str | None = None
    round_started: bool = False
    next_round: float | None = None
    problems: tuple[Problem, ...] = ()
    summary: str | None = None
    imbalance: float | None = None
    resharding: Progress | None = None
    restart_holds: Mapping[str, RestartHold] = field(default_factory=dict)
    """Members restarting in place whose units wait for them after this pass."""
    restart_grace: float = 0.0

    @property
    def new_table(self) -> AssignmentTable | None:
        return None if self.decision is None else self.decision.new_table

    @property
    def wake_at(self) -> float | None:
        """When to run a pass again although nothing changed (hand-off timeout, next round)."""
        times = [t for t in (self.decision and self.decision.wake_at, self.next_round) if t]
        times.extend(
            hold.until(self.restart_grace) for hold in self.restart_holds.values() if not hold.spent
        )
        return min(times) if times else None


def natural_key(name: str) -> tuple[Any, ...]:
    """Orders pod names as people do: worker-2 before worker-10."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def parse_acks(pods: Iterable[WorkerPod], key: str) -> tuple[dict[str, Ack], list[Problem]]:
    """Each pod's ack under annotation `key`, and a problem for every one that does not parse."""
    acks: dict[str, Ack] = {}
    problems: list[Problem] = []
    for pod in pods:
        text = pod.ack(key)
        if text is None:
            continue
        try:
            acks[pod.name] = Ack.from_annotation(text)
        except AssignmentFormatError as error:
            problems.append(Problem("InvalidAck", f"pod {pod.name}: {error}"))
    return acks, problems


def acked_epoch(pods: Sequence[WorkerPod], ref: ResourceRef) -> int:
    """The highest epoch of set incarnation `ref` that the pods' acks say a worker saw before
    the API server went back in time (acks naming the set, `Ack.set_uid`); each counts only for
    the pod incarnation that wrote it (0: none). Other acks cannot tell: one may be left by a
    deleted set of the same name, whose epochs this set's do not continue."""
    # Every pass asks, and almost never finds one: parse only acks whose text names the set.
    naming = [pod for pod in pods if ref.uid in (pod.ack(ref.ack_annotation) or "")]
    acks, _ = parse_acks(naming, ref.ack_annotation)
    uids = {pod.name: pod.uid for pod in naming}
    return max(
        (a.epoch for name, a in acks.items() if a.uid == uids[name] and a.set_uid == ref.uid),
        default=0,
    )


def _capacity(pod: WorkerPod, label: str | None) -> tuple[float, Problem | None]:
    if label is None or label not in pod.labels:
        return 1.0, None
    text = pod.labels[label]
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        return 1.0, Problem(
            "InvalidCapacity",
            f"pod {pod.name}: label {label}={text!r} is not a non-negative number; using 1",
        )
    return value, None


def engine_members(inp: PassInput, acks: Mapping[str, Ack]) -> tuple[list[Member], list[Problem]]:
    """The strategy's view of the pods, in natural name order."""
    balanced = inp.spec.strategy.balanced
    label = balanced.capacity_label if balanced is not None else None
    new = inp.rollout.new_revision
    members: list[Member] = []
    problems: list[Problem] = []
    departed = {pod.name for pod in inp.departed}
    for pod in sorted([*inp.pods, *inp.departed], key=lambda p: natural_key(p.name)):
        capacity, problem = _capacity(pod, label)
        if problem:
            problems.append(problem)
        ack = acks.get(pod.name)
        announced = ack is not None and ack.uid == pod.uid and ack.draining
        version = "" if new is None else NEW_REVISION if pod.revision == new else OLD_REVISION
        members.append(
            Member(
                name=pod.name,
                labels=pod.labels,
                capacity=capacity,
                ready=pod.ready and not pod.terminating,
                version=version,
                draining=pod.terminating or pod.drained or announced or pod.name in departed,
            )
        )
    return members, problems


def intended_owners(
    published: AssignmentTable, pods: Iterable[WorkerPod]
) -> tuple[dict[str, str], frozenset[str]]:
    """unit → the live member it is with or on its way to, and the units in hand-off.

    A releasing unit counts as already at its release target (the strategy must not undo a
    move in flight); a unit whose owner is gone, or is a new incarnation of the same name, has
    no owner: the strategy places it again.
    """
    uids = {pod.name: pod.uid for pod in pods}
    known = published.member_uids

    def alive(name: str | None) -> TypeGuard[str]:
        return name is not None and name in uids and uids[name] == known.get(name)

    owners: dict[str, str] = {}
    moving: set[str] = set()
    for unit, state in published.units.items():
        release = state.releasing
        if release is not None and alive(release.to) and alive(state.owner):
            owners[unit] = release.to
            moving.add(unit)
        elif alive(state.owner):
            owners[unit] = state.owner
    return owners, frozenset(moving)


def allocation_request(
    published: AssignmentTable,
    members: Sequence[Member],
    owners: Mapping[str, str],
    moving: frozenset[str],
    loads: Mapping[str, float] | None,
    held: Mapping[str, str | None] | None = None,
) -> AllocationRequest:
    """The strategy's request: each member's units oldest first (strategies shed the most
    recently placed ones, which have settled the least). A `held` unit (unit → the restarting
    member it waits for, None while that one is away) is no strategy's to move: it counts, as
    a unit in hand-off does, for the member it waits for once that one is back and ready, so
    the round does not fill a returning member as if it were empty; until then it is left
    out."""
    held = held or {}
    taking = {m.name for m in members if m.ready and not m.draining}
    back = {u: m for u, m in held.items() if m in taking}
    units = [u for u in published.unit_names if u not in held or u in back]
    by_member: dict[str, list[str]] = {m.name: [] for m in members}
    for unit in units:
        owner = back.get(unit) or owners.get(unit)
        if owner is not None:
            by_member[owner].append(unit)
    epochs = {unit: state.epoch for unit, state in published.units.items()}
    assignment = {
        name: sorted(mine, key=lambda u: epochs[u]) for name, mine in by_member.items() if mine
    }
    return AllocationRequest(
        units=list(units),
        members=members,
        assignment=assignment,
        loads=loads,
        in_progress=moving.difference(held).union(back),
    )


def _forced(move: Move, members: Mapping[str, Member]) -> bool:
    """A move that may not wait: the unit has no owner, or its owner is leaving."""
    source = members.get(move.source) if move.source is not None else None
    return source is None or source.draining or source.capacity <= 0


def imbalance(
    owners: Mapping[str, str | None],
    members: Sequence[Member],
    loads: Mapping[str, float] | None = None,
) -> float | None:
    """Most loaded eligible member (per unit of capacity) over the mean; None without any.
    Load when given, unit counts otherwise."""
    eligible = {m.name: m for m in members if m.eligible}
    if not eligible:
        return None
    # A unit not measured (yet) counts as the mean measured load, as Balanced assumes.
    default = math.fsum(loads.values()) / len(loads) if loads else 1.0
    totals: dict[str, float] = {}
    for unit, owner in owners.items():
        if owner in eligible:
            totals[owner] = totals.get(owner, 0.0) + (
                1.0 if loads is None else loads.get(unit, default)
            )
    whole = sum(totals.values())
    if whole <= 0:
        return None
    capacity = math.fsum(m.capacity for m in eligible.values())
    mean = whole / capacity
    if mean <= 0:  # tiny loads whose mean underflows
        return None
    return max(totals.get(name, 0.0) / m.capacity for name, m in eligible.items()) / mean


def startup_barrier(inp: PassInput) -> tuple[Problem, float | None] | None:
    """The first placement waits until enough members are ready, so that it is balanced instead
    of putting every unit on the first pod up and moving most of them again (Akka's
    min-nr-of-members). `startup.minMembers` waits however long it takes; without it the
    workload's replicas are waited for, up to `startup.timeout` after the set was created.
    Returns the reason to wait and when to look again, or None: place now."""
    if any(state.owner is not None for state in inp.published.units.values()):
        return None  # placed before: later changes of the fleet rebalance as usual
    startup = inp.spec.startup
    deadline: float | None = None
    if startup.min_members is not None:
        wanted = startup.min_members
    elif inp.desired_members:
        wanted = inp.desired_members
        if inp.created is not None:
            deadline = inp.created + startup.timeout.total_seconds()
            if inp.now >= deadline:
                return None
    else:
        return None
    ready = sum(1 for pod in inp.pods if pod.ready and not pod.terminating)
    if ready >= wanted:
        return None
    until = "" if deadline is None else f", at most until {rfc3339(deadline)}"
    why = "startup.minMembers" if startup.min_members is not None else "the workload's replicas"
    message = (
        f"the first placement waits for {wanted} ready member(s) ({why}); "
        f"{ready} ready so far{until}"
    )
    return Problem("WaitingForMembers", message), deadline


def scale_up_wait(inp: PassInput) -> tuple[str, float] | None:
    """While the workload scales up, optional moves wait for its missing replicas, so that the
    new pods are filled in one round; planning as each pod turns Ready moves some units twice
    (3 → 5 pods of 12 units: 3 moves onto the 4th, then 2 more of which one leaves the 4th).
    Kafka's `group.initial.rebalance.delay.ms` waits so for the first members only. The wait
    ends when every replica is ready, or `rebalance.scaleUpWait` after the first ready member
    that owns nothing turned Ready (a replica that never starts holds nothing for longer; from
    Ready, not creation, so that a slow start, a JVM's, does not use the wait up). Returns why
    the moves wait and until when, or None: rebalance now."""
    wait = inp.spec.rebalance.scale_up_wait.total_seconds()
    if not wait or not inp.desired_members:
        return None
    ready = [pod for pod in inp.pods if pod.ready and not pod.draining]
    if len(ready) >= inp.desired_members:
        return None
    owners = {state.owner for state in inp.published.units.values()}
    owners.update(state.releasing.to for state in inp.published.units.values() if state.releasing)
    if owners <= {None}:
        return None  # the first placement: startup_barrier's to wait for
    newcomers = [pod for pod in ready if pod.name not in owners]
    since = [t for pod in newcomers if (t := seconds(pod.ready_since or pod.created)) is not None]
    if not since:
        return None
    until = min(since) + wait
    if inp.now >= until:
        return None
    message = (
        f"a scale-up: waiting for the workload's replicas, {len(ready)} of "
        f"{inp.desired_members} ready, at most until {rfc3339(until)} (rebalance.scaleUpWait)"
    )
    return message, until


def unknown_pins(spec: UnitSetSpec, pods: Sequence[WorkerPod]) -> list[Problem]:
    """External pins naming a pod that is not a member: the fallback places those units, and
    the user should know the pin has no effect (a typo, a pod gone for good)."""
    external = spec.strategy.external
    if external is None:
        return []
    names = {pod.name for pod in pods}
    absent = [pin for pin in external.pins if pin.member not in names]
    if not absent:
        return []
    first = absent[0]
    return [
        Problem(
            "PinToUnknownPod",
            f"{len(absent)} pin(s) name pods that are not members, e.g. unit {first.unit} → "
            f"{first.member!r}: the fallback strategy places them",
        )
    ]


def plan_pass(inp: PassInput) -> PassResult:
    """One pass: strategy plan, held-back optional moves, one hand-off step."""
    everyone = [*inp.pods, *inp.departed]
    acks, problems = parse_acks(everyone, inp.published.set_ref.ack_annotation)
    if not inp.pods:
        no_members = Problem(
            "NoMembers", "no worker pod matches the selector; the last published assignment is kept"
        )
        return _undecided(inp, [no_members, *problems])
    barrier = startup_barrier(inp)
    if barrier is not None:
        waiting, until = barrier
        return replace(_undecided(inp, [waiting, *problems]), next_round=until)

    members, member_problems = engine_members(inp, acks)
    problems.extend(member_problems)
    problems.extend(unknown_pins(inp.spec, inp.pods))
    owners, moving = intended_owners(inp.published, everyone)
    lineage = _lineage(inp)
    holds, waiting_for = _restart_holds(inp)
    # Held units are no strategy's to place: they wait for their member alone.
    request = allocation_request(
        inp.published, members, owners, moving, inp.loads, held=waiting_for
    )
    # The strategy plans a full round (so the status can say what waits); the pass then keeps
    # its optional moves only when a round may run now.
    try:
        strategy = strategy_for(inp.spec, budget=move_budget(inp.spec.rebalance, inp.spec.units))
        plan = strategy.plan(request)
    except AllocationError as error:
        return _undecided(inp, [Problem("InvalidStrategy", str(error)), *problems])

    by_name = {m.name: m for m in members}
    round_ = _budget_round(plan, by_name, _round_hold(inp, lineage), inp)
    target = _target(owners, round_.kept, lineage, waiting_for)
    decision = _hand_off(inp, target, acks, waiting_for)
    if decision.failing:
        problems.append(release_failing(inp.published, decision.failing))
    decision, reshard = _reshard_step(inp, lineage, decision)
    decision = _with_serving_lease(
        decision, inp.published, inp.spec.rebalance.serving_lease_seconds()
    )
    current = imbalance(owners, members, inp.loads)
    summary = None
    if round_.optional:
        after = imbalance(target, members, inp.loads)
        summary = _round_summary(
            round_.kept, by_name, current, after, round_.held, inp.loads is not None
        )
    return PassResult(
        decision=decision,
        plan=plan,
        kept=round_.kept,
        held=round_.held,
        hold_reason=round_.hold_reason,
        round_started=round_.optional > 0 and decision.new_table is not None,
        next_round=round_.next_round,
        problems=tuple(problems),
        summary=summary,
        imbalance=current,
        resharding=reshard,
        restart_holds=holds,
        restart_grace=inp.spec.rebalance.restart_grace.total_seconds(),
    )


def _lineage(inp: PassInput) -> Lineage | None:
    """The count change under way (apportion key scheme only), or None."""
    if inp.spec.key_scheme is not KeySchemeName.APPORTION:
        return None
    return next_lineage(inp.published, inp.spec.units)


@dataclass(frozen=True, slots=True)
class _Hold:
    """Why optional moves wait this pass (None: they may run), when to look again, and how
    many of them may run."""

    reason: str | None
    next_round: float | None
    budget: int


def _round_hold(inp: PassInput, lineage: Lineage | None) -> _Hold:
    """Whether a rebalance round may run now: not while the count changes (units of pods that
    are gone still move, they are forced, and a merge's gathering moves are added later), a
    paused rollout, a scale-up or before the interval since the last round is over."""
    rebalance = inp.spec.rebalance
    interval = rebalance.interval.total_seconds()
    if lineage is not None:
        return _Hold(f"resharding {lineage.from_count} → {lineage.to_count}", None, 0)
    if rebalance.pause_during_rollout and inp.rollout.rolling:
        return _Hold(f"rollout in progress: {inp.rollout.message}", None, 0)
    scaling = scale_up_wait(inp)
    if scaling is not None:
        return _Hold(scaling[0], scaling[1], 0)
    if inp.last_round is not None and inp.now < inp.last_round + interval:
        return _Hold("waiting for the next rebalance round", inp.last_round + interval, 0)
    return _Hold(None, None, move_budget(rebalance, inp.spec.units))


def _restart_holds(inp: PassInput) -> tuple[dict[str, RestartHold], dict[str, str | None]]:
    """The members restarting in place after this pass, and the units that wait for them
    (unit → the member, or None while it is away)."""
    spec = inp.spec
    holds = track_holds(
        inp.restart_holds,
        inp.published,
        [*inp.pods, *(replace(pod, drained=True) for pod in inp.departed)],
        inp.now,
        spec.rebalance.restart_grace.total_seconds(),
        lambda name: stateful_identity(name, spec.workload_ref, inp.desired_members),
    )
    return holds, held_target(holds, inp.pods)


@dataclass(frozen=True, slots=True)
class _Round:
    """The moves a pass makes (`kept`), of which `optional` are a rebalance round's, and the
    optional ones it leaves for later (`held`)."""

    kept: tuple[Move, ...]
    optional: int
    held: int
    hold_reason: str | None
    next_round: float | None


def _budget_round(plan: Plan, members: Mapping[str, Member], hold: _Hold, inp: PassInput) -> _Round:
    """Forced moves all; optional ones up to the round's budget, the rest held back."""
    kept: list[Move] = []
    held = optional = 0
    for move in plan.moves:
        if _forced(move, members):
            kept.append(move)
        elif optional < hold.budget:
            kept.append(move)
            optional += 1
        else:
            held += 1
    reason, next_round = hold.reason, hold.next_round
    if held and reason is None:
        reason = f"at most {hold.budget} unit(s) move per round (rebalance.maxMovesPerRound)"
    more = held or not plan.quality.converged
    if more and next_round is None:
        # More rounds to go (the strategy stopped at its own limit, or moves were held).
        next_round = inp.now + inp.spec.rebalance.interval.total_seconds()
    return _Round(tuple(kept), optional, held, reason, next_round if more else None)


def _target(
    owners: Mapping[str, str],
    kept: Iterable[Move],
    lineage: Lineage | None,
    waiting_for: Mapping[str, str | None],
) -> dict[str, str | None]:
    """Where every unit goes this pass: where it is, moved by the kept moves, gathered onto one
    pod for a merge, held for a restarting member."""
    target: dict[str, str | None] = dict(owners)
    for move in kept:
        target[move.unit] = move.target
    if lineage is not None and not lineage.split:
        target = gather_targets(lineage, target)
    target.update(waiting_for)
    return target


def _hand_off(
    inp: PassInput,
    target: Mapping[str, str | None],
    acks: Mapping[str, Ack],
    waiting_for: Mapping[str, str | None],
) -> HandoffDecision:
    """One fenced hand-off step towards `target`; departed pods hand off as drained members."""
    live = {pod.name: pod for pod in inp.pods}
    live.update({pod.name: replace(pod, drained=True) for pod in inp.departed})
    decision = step(
        inp.published,
        target,
        acks,
        live,
        inp.now,
        inp.spec.rebalance.handoff_timeout.total_seconds(),
        generation=inp.generation,
        releases_known=inp.releases_known,
    )
    if waiting_for:
        decision = replace(decision, events=_held_events(decision.events, waiting_for))
    return decision


def _reshard_step(
    inp: PassInput, lineage: Lineage | None, decision: HandoffDecision
) -> tuple[HandoffDecision, Progress | None]:
    """A count change's progress, and the table of the new count once every unit is ready for
    it and nothing else changes this pass."""
    if lineage is None:
        return decision, None
    reshard = progress(inp.published, lineage)
    if decision.new_table is None and reshard.done:
        event = HandoffEvent(
            Reason.RESHARDED,
            str(lineage.from_count),
            str(lineage.to_count),
            tuple(str(u) for u in range(lineage.to_count)),
        )
        table = resharded(inp.published, lineage, inp.generation)
        decision = HandoffDecision(table, (event,), (), None)
    return decision, reshard


def _held_events(
    events: Iterable[HandoffEvent], held: Mapping[str, str | None]
) -> tuple[HandoffEvent, ...]:
    """A gone owner's units left unowned on purpose, because they wait for its restart, are no
    stranded units: say so instead of warning."""
    return tuple(
        replace(event, reason=Reason.HELD_FOR_RESTART)
        if event.reason is Reason.OWNER_GONE
        and event.target is None
        and all(unit in held for unit in event.units)
        else event
        for event in events
    )


def _undecided(inp: PassInput, problems: Sequence[Problem]) -> PassResult:
    """A pass that decides nothing keeps the holds as they were: a restart goes on being waited
    for while, say, the only member is away."""
    grace = inp.spec.rebalance.restart_grace.total_seconds()
    return PassResult(
        decision=None,
        problems=tuple(problems),
        restart_holds=spend_expired(inp.restart_holds, inp.now, grace) if grace > 0 else {},
        restart_grace=grace,
    )


def release_failing(table: AssignmentTable, failing: Mapping[str, str]) -> Problem:
    """The units whose owners report their release callbacks failing, per owner with its first
    unit's message: a fault worth an Event, since no hand-off ends before the retries succeed or
    handoffTimeout forces it."""
    by_owner: dict[str, list[str]] = {}
    for unit in unit_order(failing):
        by_owner.setdefault(str(table.units[unit].owner), []).append(unit)
    parts = [
        f"{owner} cannot release {len(units)} unit(s) ({_sample(units)}): {failing[units[0]]}"
        for owner, units in sorted(by_owner.items(), key=lambda kv: natural_key(kv[0]))
    ]
    return Problem(
        "ReleaseFailing",
        "; ".join(parts) + "; retried until the release succeeds or handoffTimeout reassigns",
    )


def _sample(units: Sequence[str], size: int = 8) -> str:
    return ", ".join(units[:size]) + (", …" if len(units) > size else "")


def _round_summary(
    kept: Sequence[Move],
    members: Mapping[str, Member],
    before: float | None,
    after: float | None,
    held: int,
    by_load: bool,
) -> str:
    routes = Counter(
        (m.source, m.target) for m in kept if m.source is not None and not _forced(m, members)
    )
    shown = ", ".join(f"{n} {src} → {dst}" for (src, dst), n in routes.most_common(6))
    more = ", …" if len(routes) > 6 else ""
    measure = "load" if by_load else "unit count"
    figures = f"{ratio_text(before)} → {ratio_text(after)}"
    rest = f"; {held} more wait for later rounds" if held else ""
    return (
        f"rebalancing {sum(routes.values())} unit(s) ({shown}{more}); max/mean {measure} "
        f"{figures}{rest}"
    )


def ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _with_serving_lease(
    decision: HandoffDecision, published: AssignmentTable, lease: float | None
) -> HandoffDecision:
    """The decision, with a table carrying the spec's serving lease: a new epoch when only the
    lease changed (workers take a table only under a newer epoch)."""
    table = decision.new_table
    if table is None and published.serving_lease == lease:
        return decision
    if table is None:
        table = replace(published, epoch=published.epoch + 1)
    return replace(decision, new_table=replace(table, serving_lease=lease))


def initial_table(
    set_ref: ResourceRef, spec: UnitSetSpec, generation: int, epoch: int = 0
) -> AssignmentTable:
    """Nobody owns anything, at `epoch` (the last epoch the status reported, so that a lost
    ConfigMap never makes epochs go backwards)."""
    table = AssignmentTable.initial(
        set_ref, generation=generation, key_scheme=spec.key_scheme.value, count=spec.units
    )
    return replace(table, epoch=epoch, serving_lease=spec.rebalance.serving_lease_seconds())


__all__ = [
    "PassInput",
    "PassResult",
    "Problem",
    "Rollout",
    "acked_epoch",
    "imbalance",
    "initial_table",
    "natural_key",
    "parse_acks",
    "plan_pass",
]
