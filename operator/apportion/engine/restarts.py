"""Restarts in place (`rebalance.restartGrace`, docs/handoff.md "Restarts in place").

A member whose container restarts (NotReady, same pod uid) or whose StatefulSet pod is deleted
and recreated under the same name keeps its units for a while instead of seeing them handed to
a sibling and back: a *hold*. Held units are left out of the strategy's plan and aimed at their
member alone, so they stay with the restarting incarnation, or, when the old incarnation leaves
(the hand-off step has it release them to nobody) or is gone (left unowned, as for any gone
owner), wait unowned and go to the new incarnation under a new token, exactly as to a
newcomer. A hold ends when the member is Ready with its units, or `grace` after it began on the
operator's clock, when placement is normal again.

Pure: the clock and the pods come in as arguments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apportion.api.assignment import AssignmentTable
from apportion.api.common import WorkloadKind, WorkloadRef, rfc3339, seconds
from apportion.api.pods import WorkerPod


@dataclass(frozen=True, slots=True)
class RestartHold:
    """Units kept for member `pod`, which began restarting at `since` (Unix seconds). A spent
    hold (its grace is over) keeps no unit: it only stops a new hold from starting for the same
    absence."""

    pod: str
    since: float
    units: frozenset[str]

    @property
    def spent(self) -> bool:
        return not self.units

    def until(self, grace: float) -> float:
        return self.since + grace


def stateful_identity(pod: str, workload: WorkloadRef | None, replicas: int | None) -> bool:
    """Whether a pod of this name will come back when its incarnation is gone: it is an ordinal
    of the set's StatefulSet below its replicas (a scaled-in ordinal never returns)."""
    if workload is None or workload.kind is not WorkloadKind.STATEFUL_SET or replicas is None:
        return False
    prefix = f"{workload.name}-"
    ordinal = pod.removeprefix(prefix)
    return pod.startswith(prefix) and ordinal.isdigit() and int(ordinal) < replicas


def track_holds(
    holds: Mapping[str, RestartHold],
    published: AssignmentTable,
    pods: Sequence[WorkerPod],
    now: float,
    grace: float,
    returns: Callable[[str], bool],
) -> dict[str, RestartHold]:
    """The holds after this pass. `pods`: the set's pods present (those no longer selected as
    drained); `returns`: whether a new incarnation of a member's name is expected once the old
    one is gone (`stateful_identity`)."""
    if grace <= 0:
        return {}
    live = {pod.name: pod for pod in pods}
    uids = published.member_uids
    owned: dict[str, set[str]] = {}
    for unit, state in published.units.items():
        if state.owner is not None:
            owned.setdefault(state.owner, set()).add(unit)
    kept: dict[str, RestartHold] = {}
    for name in sorted(holds.keys() | owned.keys()):
        hold = holds.get(name)
        pod = live.get(name)
        if pod is not None and pod.drained:
            continue  # drained or no longer selected: its units are handed off, not kept
        same = pod is not None and uids.get(name) == pod.uid
        leaving = pod is not None and pod.terminating
        if pod is not None and same and pod.ready and not leaving:
            continue  # back, and owns what it had (or it never left)
        if (leaving or not same) and not returns(name):
            continue  # leaves for good: its units are handed off or placed again at once
        if hold is not None and now >= hold.until(grace):
            # Spent: placement is normal again, and no new hold starts for this absence (it
            # would keep the units forever), until the member is back or gone for good.
            kept[name] = RestartHold(name, hold.since, frozenset())
            continue
        mine = owned.get(name, set()) | (hold.units if hold is not None else frozenset())
        units = frozenset(
            u for u in mine if u in published.units and published.units[u].owner in (None, name)
        )
        if units or hold is not None:
            kept[name] = RestartHold(name, now if hold is None else hold.since, units)
    return kept


def spend_expired(
    holds: Mapping[str, RestartHold], now: float, grace: float
) -> dict[str, RestartHold]:
    """The holds as a pass that decides nothing keeps them (no members, a fence): as they were,
    but spent once their grace is over, so that nothing waits for a deadline already past."""
    return {
        name: hold if now < hold.until(grace) else RestartHold(name, hold.since, frozenset())
        for name, hold in holds.items()
    }


def held_target(
    holds: Mapping[str, RestartHold], pods: Sequence[WorkerPod]
) -> dict[str, str | None]:
    """unit → where a held unit goes: its member while a pod of that name is there (one that is
    terminating releases it to nobody, `handoff.step`), else nowhere (it stays unowned)."""
    up = {pod.name for pod in pods if not pod.drained}
    return {
        unit: (name if name in up else None) for name, hold in holds.items() for unit in hold.units
    }


MAX_RANGES_TEXT = 65536
"""status.restartHolds[].units at most: units scattered over many members would otherwise make
the status too big to write; the ranges beyond it are not kept across an operator restart
(those units are then placed as usual: moves, never a safety matter)."""


def unit_ranges(units: frozenset[str]) -> str:
    """Held units as the status stores them: "0-7,12" (units are numbered), cut to
    `MAX_RANGES_TEXT` at a range boundary."""
    numbers = sorted(int(u) for u in units)
    runs: list[str] = []
    start = prev = None
    for n in [*numbers, None]:
        if start is not None and prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    text = ",".join(runs)
    if len(text) > MAX_RANGES_TEXT:
        text = text[: text.rindex(",", 0, MAX_RANGES_TEXT + 1)]
    return text


def parse_unit_ranges(text: str) -> frozenset[str]:
    units: set[str] = set()
    for run in filter(None, text.split(",")):
        low, _, high = run.partition("-")
        units.update(str(n) for n in range(int(low), int(high or low) + 1))
    return frozenset(units)


def hold_rows(holds: Mapping[str, RestartHold], grace: float) -> list[dict[str, Any]]:
    """The holds as `status.restartHolds` lists them, in pod order; `hold_from_row` reads
    one back, so that a restarted operator or a standby goes on waiting (docs/handoff.md)."""
    return [
        {
            "pod": hold.pod,
            "since": rfc3339(hold.since),
            "until": rfc3339(hold.until(grace)),
            "units": unit_ranges(hold.units),
        }
        for hold in sorted(holds.values(), key=lambda h: h.pod)
    ]


def hold_from_row(row: Mapping[str, Any]) -> RestartHold:
    since = seconds(str(row["since"]))
    if since is None:
        raise ValueError(f"restart hold of {row['pod']} has no since")
    return RestartHold(str(row["pod"]), since, parse_unit_ranges(str(row.get("units") or "")))
