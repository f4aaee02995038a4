"""What the set loop decides around a pass (`apportion.controllers.unitsets.loop.SetLoop`): from
what it gathered (the published table, the pods it reads, the rollout, load figures),
whether anything is new since the last pass, the pass itself (`apportion.engine.set_pass`, or
the published table standing while members cannot be known or a fence holds), and when to look
again although nothing changes. Pure: the loop reads the caches and the workers and writes what
comes back; the state between passes is `apportion.engine.set_state.SetState`.

A pass that finds nothing new costs what gathering costs: one view per selected pod, one look at
each pod the set reads for owners that left the selection, and a tuple comparison — nothing in
proportion to the other pods of the namespace, which a thousand sets may share.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from apportion.api.assignment import AssignmentTable
from apportion.api.pods import WorkerPod
from apportion.api.unitset import UnitSetSpec
from apportion.engine.handoff import Reason
from apportion.engine.restarts import RestartHold, spend_expired
from apportion.engine.set_pass import PassInput, PassResult, Problem, Rollout, plan_pass
from apportion.engine.set_state import SetState


@dataclass(frozen=True)
class Gathered:
    """What the set loop read for one pass.

    `members`: the selected pods; `visible`: the pods the set reads, its selection and the
    owners of its published units, which stay visible after they leave the selection (never
    the rest of the namespace: a pass costs what its own pods cost). `problem`: why
    members cannot be known (the workload is missing), or None. `desired_members`: the
    workload's replicas, when the spec names a workload.
    """

    spec: UnitSetSpec
    published: AssignmentTable
    generation: int
    members: Sequence[WorkerPod]
    visible: Sequence[WorkerPod]
    now: float
    rollout: Rollout = field(default_factory=Rollout)
    problem: Problem | None = None
    loads: Mapping[str, float] | None = None
    metrics_problem: Problem | None = None
    desired_members: int | None = None
    created: float | None = None


@dataclass(frozen=True)
class Prepared:
    """A pass's inputs as the engine sees them, and whether they are new.

    `views`: the members as this set sees them (its ack), by name; `departed`: owners no longer
    selected that still run; `problem`: why the published table stands (members unknown, a
    fence); `fingerprint`: everything a pass decides from that changes between passes;
    `load_tick`: the rebalance interval the load figures belong to (None without figures).
    """

    views: tuple[WorkerPod, ...]
    departed: tuple[WorkerPod, ...]
    problem: Problem | None
    fingerprint: tuple[Hashable, ...]
    load_tick: int | None
    new: bool
    """Whether a pass must run: the fingerprint changed, or the last pass's wake-up is due."""


def departed_owners(
    published: AssignmentTable, visible: Sequence[WorkerPod], members: Sequence[WorkerPod]
) -> list[WorkerPod]:
    """Owners of published units that are no longer selected but still run (the same pod: the
    uid the table knows): they may still serve their units, so they hand them off like draining
    members instead of losing them unfenced."""
    uids = published.member_uids
    owners = {name for name, units in published.by_member().items() if units}
    selected = {pod.uid for pod in members}
    return [
        pod
        for pod in visible
        if pod.name in owners and uids.get(pod.name) == pod.uid and pod.uid not in selected
    ]


def prepare(
    g: Gathered,
    state: SetState,
    last_fingerprint: tuple[Hashable, ...] | None,
    wake_at: float | None,
) -> Prepared:
    """The pass's inputs, and whether they differ from the last pass's (`last_fingerprint`)
    or its wake-up (`wake_at`) is due. Lifts a fence whose time is up."""
    ack = g.published.set_ref.ack_annotation
    views = tuple(sorted((pod.for_set(ack) for pod in g.members), key=lambda v: v.name))
    departed = tuple(
        sorted(
            (pod.for_set(ack) for pod in departed_owners(g.published, g.visible, g.members)),
            key=lambda v: v.name,
        )
    )
    problem = g.problem or state.fence(g.now)
    # Load figures change with every scrape: with them, plan at most once per interval.
    interval = g.spec.rebalance.interval.total_seconds()
    load_tick = None if g.loads is None else int(g.now // interval)
    fingerprint: tuple[Hashable, ...] = (
        g.generation,
        g.published.epoch,
        views,
        departed,
        g.rollout,
        load_tick,
        problem,
        g.metrics_problem,
    )
    due = wake_at is not None and g.now >= wake_at
    return Prepared(
        views, departed, problem, fingerprint, load_tick, fingerprint != last_fingerprint or due
    )


@dataclass(frozen=True)
class Outcome:
    """A pass's result, whether the strategy planned it, and the members whose units start to
    wait for their restart with it (worth an Event each)."""

    result: PassResult
    planned: bool
    new_holds: tuple[tuple[str, RestartHold], ...] = ()


def run(g: Gathered, p: Prepared, state: SetState) -> Outcome:
    """The pass: the published table stands while `p.problem` holds (the restart holds age as
    they would), otherwise `plan_pass` decides. Notes the pass's restart holds in `state`."""
    if p.problem is not None:
        result = PassResult(
            decision=None,
            problems=(p.problem,),
            restart_holds=spend_expired(state.restart_holds, g.now, state.restart_grace),
            restart_grace=state.restart_grace,
        )
        return Outcome(result, planned=False)
    result = plan_pass(
        PassInput(
            spec=g.spec,
            published=g.published,
            generation=g.generation,
            pods=p.views,
            now=g.now,
            last_round=state.last_round,
            rollout=g.rollout,
            loads=g.loads,
            departed=p.departed,
            desired_members=g.desired_members if g.spec.workload_ref else None,
            created=g.created,
            releases_known=state.known_releases(),
            restart_holds=state.restart_holds,
        )
    )
    new_holds = tuple(
        (name, hold)
        for name, hold in result.restart_holds.items()
        if name not in state.restart_holds and not hold.spent
    )
    state.note_holds(result.restart_holds, result.restart_grace)
    return Outcome(result, planned=True, new_holds=new_holds)


def written(state: SetState, result: PassResult, now: float, handoff_timeout: float) -> None:
    """What the state keeps of a pass whose table was written: when its rebalance round
    started, and a hand-off its timeout forced (reported for a while)."""
    if result.round_started:
        state.last_round = now
    for event in () if result.decision is None else result.decision.events:
        if event.reason is Reason.HANDOFF_TIMED_OUT:
            state.hand_off_timed_out(now, event.message(), handoff_timeout)


def next_wake(g: Gathered, p: Prepared, result: PassResult, state: SetState) -> float | None:
    """When to pass again although nothing changes: the pass's own wake-up (a hand-off timeout,
    the next round, a restart hold's end), the next load tick, the end of a fence or of a
    reported timeout, and — while the members have not reported their load yet — the next
    scrape, so that the figures are fresh when they come and the grace is kept."""
    wake_at = result.wake_at
    if p.load_tick is not None:
        interval = g.spec.rebalance.interval.total_seconds()
        wake_at = min(wake_at or math.inf, (p.load_tick + 1) * interval)
    wake_at = state.next_wake(wake_at)
    scrape = g.spec.metrics.scrape
    if state.loads_missing_since is not None and scrape is not None:
        wake_at = min(wake_at or math.inf, g.now + scrape.interval.total_seconds())
    return wake_at


__all__ = [
    "Gathered",
    "Outcome",
    "Prepared",
    "departed_owners",
    "next_wake",
    "prepare",
    "run",
    "written",
]
