"""What a set's controller carries from one pass to the next, as a pure state machine: the epoch
it reserved, the fence raised after a repair, when it learnt of each release, the grace before
missing load figures are a fault, and how long a timed-out hand-off stays reported.

Clocks, tables and the status come in as arguments; nothing here reads a clock or the API.
Everything that must outlive the operator process goes through the status it returns to write
(`reservation`) and comes back through `SetState.from_status`: a restarted operator, or a
standby taking over, continues from the status and the published table alone. The operator's
`SetLoop` and the hypothesis model of the hand-off (tests/unit/test_handoff_model.py) drive this
same code (docs/handoff.md, "When the table is lost").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from apportion.api.assignment import AssignmentTable
from apportion.api.common import ScrapeSpec, rfc3339, seconds
from apportion.engine.handoff import Recovery, recover
from apportion.engine.restarts import RestartHold, hold_from_row, hold_rows
from apportion.engine.set_pass import Problem

TIMEOUT_REPORT_SECONDS: Final = 60.0
"""Degraded stays HandoffTimedOut at least this long (or one handoffTimeout) after a forced
reassignment, so that `kubectl get` shows it."""
LOADS_GRACE_MIN: Final = 30.0
"""Seconds new workers get to start serving and reporting, however short the scrape interval."""
FENCED: Final = Problem("AssignmentFenced", "every unit stays unowned until the fence has held")


def loads_grace(scrape: ScrapeSpec) -> float:
    """How long workers may report no unit's load before it is a fault: two scrapes, and at
    least what a fleet of starting processes needs on a busy node."""
    return max(
        LOADS_GRACE_MIN, 2 * scrape.interval.total_seconds() + scrape.timeout.total_seconds()
    )


@dataclass
class SetState:
    """One set's decision state between passes (see the module's docstring)."""

    reserved: int = 0
    """The highest epoch the status reserves: every table ever written is at or below it."""
    fence_until: float | None = None
    fence_problem: Problem | None = None
    remembered: AssignmentTable | None = None
    """The last table written or read intact: what the workers serve, should the ConfigMap be
    lost, garbled or rolled back."""
    releases_known: dict[tuple[str, int], float] = field(default_factory=dict)
    """(unit, release epoch) → when this replica knew the release was published: a release is
    timed from then, never from a `since` another replica's clock wrote (the serving lease's
    inequality, docs/handoff.md)."""
    timed_out: tuple[float, Problem] | None = None
    last_round: float | None = None
    loads_missing_since: float | None = None
    known_loads: dict[str, float] = field(default_factory=dict)
    restart_holds: dict[str, RestartHold] = field(default_factory=dict)
    """Members restarting in place whose units wait for them (`apportion.engine.restarts`)."""
    restart_grace: float = 0.0
    holds_written: dict[str, RestartHold] = field(default_factory=dict)
    """The holds the status says: a hold goes into the status before the table that leaves its
    units unowned, so that a successor does not hand them to a sibling."""

    @classmethod
    def from_status(cls, status: Mapping[str, Any]) -> SetState:
        """The state a new operator process starts from: a fence and a reported timeout outlive
        the operator that raised them, a successor holds them just as long."""
        fence_until = seconds(status.get("fencedUntil"))
        # A hold is timed from the `since` another replica wrote: a skewed clock only makes
        # the wait shorter or longer, the units stay fenced by their tokens either way.
        holds = {h.pod: h for h in map(hold_from_row, status.get("restartHolds") or ())}
        return cls(
            reserved=int(status.get("reservedEpoch") or 0),
            fence_until=fence_until,
            fence_problem=None if fence_until is None else FENCED,
            timed_out=_timed_out_from(status),
            last_round=seconds(status.get("lastRebalanceTime")),
            restart_holds=holds,
            holds_written=dict(holds),
        )

    # ------------------------------------------------------------------------------ the table

    def resume(
        self,
        found: AssignmentTable | None,
        unreadable: str | None,
        status: Mapping[str, Any],
        template: AssignmentTable,
        now: float,
        handoff_timeout: float,
        acked: int = 0,
    ) -> tuple[AssignmentTable, Recovery | None]:
        """The table to continue from, read back as `found` (or `unreadable`), and the repair
        to write first when it is gone, unreadable, rolled back or tampered with, or when a
        worker acknowledged an epoch above all of it (`acked`: the API server went back;
        `engine.handoff.recover`; a fenced repair raises the fence for `handoff_timeout`)."""
        self.reserved = max(self.reserved, int(status.get("reservedEpoch") or 0))
        reserved = self.reserved
        if not reserved:
            # A status from before epochs were reserved: the table and the status's epoch are
            # all that tell how far epochs went.
            reserved = max(int(status.get("epoch") or 0), found.epoch if found else 0)
        repair = recover(
            found,
            unreadable,
            published=int(status.get("epoch") or 0),
            reserved=reserved,
            remembered=self.remembered,
            template=template,
            acked=acked,
        )
        if repair is None:
            table = found or template
            self.remembered = table
            self.note_releases(table, now)
            return table, None
        if repair.fenced:
            self.fence_until = now + handoff_timeout
            self.fence_problem = Problem("AssignmentFenced", repair.message)
        return repair.table, repair

    def reservation(self, table: AssignmentTable) -> dict[str, Any] | None:
        """The status to write before `table` (None: nothing to write): its epoch reserved and
        the fence's end, so the status always names an epoch at or above every table written."""
        holds_changed = self.restart_holds != self.holds_written
        if table.epoch <= self.reserved and self.fence_until is None and not holds_changed:
            return None
        fence = None if self.fence_until is None else timestamp(self.fence_until)
        status: dict[str, Any] = {
            "reservedEpoch": max(table.epoch, self.reserved),
            "fencedUntil": fence,
        }
        if holds_changed:
            status["restartHolds"] = hold_rows(self.restart_holds, self.restart_grace)
        return status

    def note_holds(self, holds: Mapping[str, RestartHold], grace: float) -> None:
        """The holds a pass decided on, to be written before its table (`reservation`)."""
        self.restart_holds = dict(holds)
        self.restart_grace = grace

    def holds_reported(self) -> None:
        """A status with the current holds was written (the reservation, or the report)."""
        self.holds_written = dict(self.restart_holds)

    def went_back(self, acked: int, published: AssignmentTable) -> bool:
        """Whether a worker acknowledged an epoch (`acked`) above every epoch this operator
        published or reserved: the API server went back in time, and the table is to be read
        back and judged again (`resume`)."""
        return acked > max(published.epoch, self.reserved)

    def written(self, table: AssignmentTable, now: float) -> None:
        """`table` was written, after its `reservation`."""
        self.reserved = max(table.epoch, self.reserved)
        self.remembered = table
        self.note_releases(table, now)

    def fence(self, now: float) -> Problem | None:
        """Why nothing may be placed now, while a fence holds; it lifts at its end."""
        if self.fence_until is None:
            return None
        if now < self.fence_until:
            return self.fence_problem
        self.fence_until = self.fence_problem = None
        return None

    # ------------------------------------------------------------------------------- releases

    def note_releases(self, table: AssignmentTable, known_at: float) -> None:
        """The releases of `table`, committed by `known_at` (a write returned, a read came back)."""
        releasing = {(unit, r.epoch) for unit, r in table.releasing().items()}
        self.releases_known = {k: v for k, v in self.releases_known.items() if k in releasing}
        for key in releasing:
            self.releases_known.setdefault(key, known_at)

    def known_releases(self) -> dict[str, float]:
        """unit → when its release was known; `note_releases` keeps the map to exactly the
        releases of the last table read or written."""
        return {unit: known_at for (unit, _), known_at in self.releases_known.items()}

    def hand_off_timed_out(self, now: float, message: str, handoff_timeout: float) -> None:
        self.timed_out = (
            now + max(TIMEOUT_REPORT_SECONDS, handoff_timeout),
            Problem("HandoffTimedOut", message),
        )

    def timeout_problem(self, now: float) -> Problem | None:
        """HandoffTimedOut while it is still reported."""
        if self.timed_out is not None and now >= self.timed_out[0]:
            self.timed_out = None
        return None if self.timed_out is None else self.timed_out[1]

    # ---------------------------------------------------------------------------------- loads

    def loads(
        self, reported: Mapping[str, float] | None, now: float, grace: float
    ) -> tuple[dict[str, float] | None, bool]:
        """The unit loads to plan with, and whether their absence is a fault by now. Workers
        report a unit's load once they serve it: while the first table is new none may have yet;
        only an absence that outlasts `grace` is a fault (Prometheus' `for:`, in effect). A unit
        in hand-off is reported by nobody for a moment: its last load stands."""
        if reported is None:
            self.known_loads.clear()
            since = self.loads_missing_since = self.loads_missing_since or now
            return None, now >= since + grace
        self.loads_missing_since = None
        self.known_loads.update(reported)
        return dict(self.known_loads), False

    def no_loads_wanted(self) -> None:
        """The spec scrapes nothing (or there are no members): no grace is running."""
        self.loads_missing_since = None

    def next_wake(self, wake_at: float | None) -> float | None:
        """The pass's own wake-up, brought forward to when a reported timeout or a fence ends."""
        due = [t for t in (wake_at, self.fence_until) if t is not None]
        if self.timed_out is not None:
            due.append(self.timed_out[0])
        return min(due) if due else None


def _timed_out_from(status: Mapping[str, Any]) -> tuple[float, Problem] | None:
    """A HandoffTimedOut the status reports stays reported for its full time after a restart
    or a failover: the standby reads it back instead of forgetting it."""
    degraded = next(
        (c for c in status.get("conditions") or () if c.get("type") == "Degraded"), None
    )
    if degraded is None or degraded.get("reason") != "HandoffTimedOut":
        return None
    since = seconds(degraded.get("lastTransitionTime"))
    if since is None:
        return None
    return since + TIMEOUT_REPORT_SECONDS, Problem("HandoffTimedOut", degraded.get("message", ""))


def timestamp(unix_seconds: float) -> str:
    """RFC 3339, whole seconds rounded up (a fence never ends early)."""
    return rfc3339(math.ceil(unix_seconds))
