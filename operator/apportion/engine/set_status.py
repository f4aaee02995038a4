"""The status of a PartitionSet or ShardSet after a pass (`apportion.engine.set_pass`): its
figures, and the conditions Ready, Reconciling, Stalled, Balanced, Progressing, Degraded and
Resharding (docs/api.md), every field present so that a merge patch clears stale ones. Pure: the
pass's clock and the conditions the object has come in as arguments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.api.assignment import AssignmentTable, Suspensions
from apportion.api.common import rfc3339
from apportion.api.conditions import (
    Condition,
    ConditionType,
    Verdict,
    condition_time,
    set_conditions,
)
from apportion.api.pods import WorkerPod
from apportion.api.unitset import MAX_MEMBER_ROWS, MetricsSource
from apportion.engine.kstatus import verdicts
from apportion.engine.reshard import Progress
from apportion.engine.restarts import hold_rows
from apportion.engine.set_pass import PassResult, Problem, natural_key, parse_acks, ratio_text


def suspensions(pods: Sequence[WorkerPod], key: str) -> dict[str, tuple[str, Suspensions]]:
    """Pod uid → (name, the outages of its serving lease), from each pod's ack under `key`: told
    after the fact, since nothing could be written while they lasted."""
    acks, _ = parse_acks(pods, key)
    return {
        pod.uid: (pod.name, ack.suspended)
        for pod in pods
        if (ack := acks.get(pod.name)) is not None
        and ack.suspended is not None
        and ack.uid == pod.uid
    }


def suspension_news(
    told: Mapping[str, tuple[str, Suspensions]], seen: Mapping[str, int]
) -> list[str]:
    """What an Event says of each pod whose acks tell of more suspensions than `seen` (uid → count
    already reported), in pod order."""
    news = []
    for uid, (name, suspended) in sorted(told.items(), key=lambda kv: natural_key(kv[1][0])):
        new = suspended.count - seen.get(uid, 0)
        if new <= 0:
            continue
        times = "" if new == 1 else f" {new} times; the last time"
        news.append(
            f"{name} served nothing{times} for {suspended.last_seconds:.1f}s: its serving lease "
            "ran out, as it could not confirm the assignment (API server out of reach, or the "
            "process paused); it serves again"
        )
    return news


@dataclass(frozen=True)
class StatusInput:
    """What the status reports: the table as published after this pass, and the pass."""

    table: AssignmentTable
    result: PassResult
    pods: Sequence[WorkerPod]
    generation: int
    config_map: str | None
    now: float
    """The pass's clock (Unix seconds): condition transition times; the engine reads none."""
    conditions: Sequence[Condition | Mapping[str, Any]] = ()
    last_round: float | None = None
    metrics_source: MetricsSource = MetricsSource.COUNTS
    loads: Mapping[str, float] | None = None
    extra_problems: Sequence[Problem] = ()
    awaiting_loads: str | None = None
    """Why placement counts units while it waits for the members' first load figures (the
    metrics grace), or None."""


def unit_set_status(s: StatusInput) -> dict[str, Any]:
    """The status (wire form, every field present so a merge patch clears stale ones)."""
    table, result = s.table, s.result
    live = {pod.name: pod for pod in s.pods}
    uids = table.member_uids
    held_by: dict[str, list[str]] = {}
    owned = 0
    for unit, state in table.units.items():
        owner = state.owner
        if owner is not None and owner in live and live[owner].uid == uids.get(owner):
            held_by.setdefault(owner, []).append(unit)
            owned += 1
    releasing = sum(1 for state in table.units.values() if state.releasing is not None)

    # Rounded as the status shows it, so that the order agrees with the figures.
    weights = {
        name: f"{len(units) if s.loads is None else sum(s.loads.get(u, 0.0) for u in units):.2f}"
        for name, units in held_by.items()
    }
    rows = [
        {
            "member": name,
            "units": len(held_by[name]),
            "load": None if s.loads is None else weights[name],
        }
        for name in sorted(held_by, key=lambda n: (-float(weights[n]), natural_key(n)))
    ][:MAX_MEMBER_ROWS]
    problems = [*result.problems, *s.extra_problems]
    reshard = result.resharding
    new_count = reshard is not None and table.count != reshard.lineage.from_count
    if new_count:
        reshard = None  # this pass published the new count
    conditions = _conditions(s, owned, releasing, problems, reshard, new_count=new_count)
    last_round = s.last_round
    return {
        "observedGeneration": s.generation,
        "epoch": table.epoch,
        "members": len(s.pods),
        "readyMembers": sum(1 for name in held_by if live[name].ready),
        "assignedUnits": owned,
        "assignmentConfigMap": s.config_map,
        "imbalance": None if result.imbalance is None else f"{result.imbalance:.2f}",
        "movesInProgress": releasing,
        "releasesFailing": 0 if result.decision is None else len(result.decision.failing),
        "servingSuspensions": sum(
            told.count for _, told in suspensions(s.pods, s.table.set_ref.ack_annotation).values()
        ),
        "lastRebalanceTime": None if last_round is None else rfc3339(last_round),
        "metricsSource": s.metrics_source.value,
        "memberUnits": [{k: v for k, v in row.items() if v is not None} for row in rows],
        "restartHolds": hold_rows(result.restart_holds, result.restart_grace)[:MAX_MEMBER_ROWS],
        "resharding": None
        if reshard is None
        else {
            "fromCount": reshard.lineage.from_count,
            "toCount": reshard.lineage.to_count,
            "phase": reshard.phase,
            "readyUnits": reshard.ready,
            "totalUnits": reshard.total,
        },
        "conditions": [c.to_json_dict() for c in conditions],
    }


@dataclass(frozen=True)
class _Facts:
    """What the conditions are judged from: the status input and the figures of the table."""

    s: StatusInput
    owned: int
    releasing: int
    problems: Sequence[Problem]
    reshard: Progress | None
    new_count: bool

    @property
    def total(self) -> int:
        return len(self.s.table.units)

    @property
    def pending(self) -> int:
        plan = self.s.result.plan
        return 0 if plan is None else len(plan.moves)

    @property
    def blocking(self) -> Problem | None:
        return next((p for p in self.problems if p.reason in _BLOCKING), None)


def _conditions(
    s: StatusInput,
    owned: int,
    releasing: int,
    problems: Sequence[Problem],
    reshard: Progress | None,
    *,
    new_count: bool = False,
) -> list[Condition]:
    f = _Facts(s, owned, releasing, problems, reshard, new_count)
    reconciling, stalled = verdicts(problems, _reconciling(f))
    return set_conditions(
        s.conditions,
        (
            (ConditionType.READY, _ready(f)),
            (ConditionType.RECONCILING, reconciling),
            (ConditionType.STALLED, stalled),
            (ConditionType.BALANCED, _balanced(f)),
            (ConditionType.PROGRESSING, _progressing(f)),
            (ConditionType.DEGRADED, _degraded(problems)),
            (ConditionType.RESHARDING, _resharding(s.table, reshard)),
        ),
        observed_generation=s.generation,
        now=condition_time(s.now),
    )


def _ready(f: _Facts) -> Verdict:
    result, total, owned, blocking = f.s.result, f.total, f.owned, f.blocking
    if blocking is not None:
        return False, blocking.reason, blocking.message
    if owned < total and any(not h.spent for h in result.restart_holds.values()):
        # kubectl describe should say why units are unowned: they wait for a restart.
        return False, "WaitingForRestart", _waiting_for_restart(result, total - owned)
    if owned < total:
        return False, "UnitsUnassigned", f"{total - owned} of {total} unit(s) have no live owner"
    return True, "Assigned", f"every unit has a live owner (epoch {f.s.table.epoch})"


def _balanced(f: _Facts) -> Verdict:
    result, pending, blocking = f.s.result, f.pending, f.blocking
    plan = result.plan
    unsettled = [p.name for p in f.s.pods if not p.ready or p.terminating]
    if blocking is not None:
        return False, blocking.reason, blocking.message
    if f.releasing:
        return False, "HandoffInProgress", f"{f.releasing} unit(s) being handed off"
    if f.new_count:
        # This pass planned the previous count; the new units sit on their parents' pods
        # until the next pass places them.
        return False, "Rebalancing", f"{f.total} unit(s) of the new count not placed yet"
    if pending and result.hold_reason:
        return False, "RebalancePending", f"{pending} move(s) pending: {result.hold_reason}"
    if pending or (plan is not None and not plan.quality.converged):
        return False, "Rebalancing", f"{pending} move(s) planned"
    if unsettled:
        # Placement is not final while a member is starting or leaving (LeastShards, as Akka,
        # does not even plan a round then).
        shown = ", ".join(unsettled[:4]) + (", …" if len(unsettled) > 4 else "")
        return False, "MembersNotReady", f"waiting for {len(unsettled)} member(s): {shown}"
    return True, "Balanced", f"max/mean {ratio_text(result.imbalance)}"


def _progressing(f: _Facts) -> Verdict:
    if f.releasing:
        return True, "HandoffInProgress", f"{f.releasing} unit(s) being handed off"
    if f.pending and f.blocking is None:
        return True, "RebalancePending", f.s.result.hold_reason or "moves planned"
    return False, "Stable", "no moves under way"


def _degraded(problems: Sequence[Problem]) -> Verdict:
    faults = [p for p in problems if p.reason not in _NOT_FAULTS]
    if not faults:
        return False, "AsExpected", ""
    first = faults[0]
    others = f" (and {len(faults) - 1} more problem(s))" if len(faults) > 1 else ""
    return True, first.reason, first.message + others


def _resharding(table: AssignmentTable, reshard: Progress | None) -> Verdict:
    if reshard is not None:
        lineage = reshard.lineage
        return (
            True,
            reshard.phase,
            f"{lineage.from_count} → {lineage.to_count} units: {reshard.ready} of "
            f"{reshard.total} ready to publish",
        )
    grew_from = table.lineage
    since = "" if grew_from is None else f", resharded from {grew_from.from_count} at epoch "
    since += "" if grew_from is None else str(grew_from.epoch)
    return False, "Resharded", f"the published table has {table.count} units{since}"


def _reconciling(f: _Facts) -> Verdict:
    """What the set is doing while it is not stalled (`apportion.engine.kstatus.verdicts`
    decides that), the most pressing first."""
    total, blocking, reshard = f.total, f.blocking, f.reshard
    if blocking is not None:  # a fence, the wait for the first members: they end by themselves
        return True, blocking.reason, blocking.message
    if reshard is not None:
        lineage = reshard.lineage
        counts = f"{lineage.from_count} → {lineage.to_count}"
        return True, "Resharding", f"{counts} units ({reshard.phase})"
    if f.new_count:
        return True, "Resharding", f"{total} unit(s) of the new count not placed yet"
    if f.releasing:
        return True, "HandoffInProgress", f"{f.releasing} unit(s) being handed off"
    if f.owned < total:
        return True, "Placing", f"{total - f.owned} of {total} unit(s) have no owner yet"
    if f.pending:
        held = f": {f.s.result.hold_reason}" if f.s.result.hold_reason else ""
        return True, "Rebalancing", f"{f.pending} move(s) planned{held}"
    if f.s.awaiting_loads is not None:
        return True, "AwaitingMetrics", f.s.awaiting_loads
    return False, "Settled", f"every unit placed, no move under way (epoch {f.s.table.epoch})"


def _waiting_for_restart(result: PassResult, unowned: int) -> str:
    holds = sorted(
        (h for h in result.restart_holds.values() if not h.spent), key=lambda h: natural_key(h.pod)
    )
    each = ", ".join(
        f"{len(h.units)} for {h.pod} until {rfc3339(h.until(result.restart_grace))}"
        for h in holds[:4]
    )
    return (
        f"{unowned} unit(s) have no live owner; unit(s) held for pods restarting in place "
        f"(rebalance.restartGrace): {each}"
    )


_BLOCKING = frozenset(
    {
        "NoMembers",
        "InvalidStrategy",
        "InvalidSpec",
        "WorkloadNotFound",
        "AssignmentFenced",
        "PassFailed",
        "WaitingForMembers",
    }
)
"""Problems that stop placement altogether (the published table stands)."""

_NOT_FAULTS = frozenset({"WaitingForMembers"})
"""Reasons that hold placement back although nothing is wrong: not Degraded."""


__all__ = ["StatusInput", "suspension_news", "suspensions", "unit_set_status"]
