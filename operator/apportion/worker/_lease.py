"""The serving lease: a worker serves only while its view of the table is confirmed recent
(docs/handoff.md, "Cut off or paused: the serving lease"). Pure: the clock is passed in.

The idea is the read lease of Gray and Cheriton (Leases, SOSP 1989) with the holder's side
timed conservatively: a confirmation counts from when the confirming request was *sent*, not
when its answer arrived, so however long the answer took, the table it showed was current at
or after that instant. The operator reassigns a silent owner's unit only `handoffTimeout` after
it knew the release was published, so a lease shorter than that by the clocks' rate difference
ends before anyone else may serve the unit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

RENEWALS_PER_LEASE: Final = 4
"""Confirmations a worker sends per lease: one lost or slow confirmation costs nothing."""


def boot_clock() -> float:
    """Seconds on a clock that never steps and keeps counting while the machine or the VM is
    suspended (CLOCK_BOOTTIME; CLOCK_MONOTONIC stops then, and a lease must not outlive a
    suspension). Falls back to the monotonic clock where there is no boot-time clock."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.monotonic() if boottime is None else time.clock_gettime(boottime)


@dataclass
class ServingLease:
    """`duration` seconds of serving per confirmation; None: never runs out (KeepServing).

    A unit the table releases from this worker may be finished only until its own deadline:
    the last confirmation *before* the table that released it, plus the duration. Confirming
    a table that asks for the release does not extend it: the operator started counting its
    timeout when that table was published.
    """

    duration: float | None
    clock: Callable[[], float] = boot_clock
    confirmed_at: float | None = None
    """Send time of the newest request whose answer showed the current table."""
    release_deadlines: dict[str, float] = field(default_factory=dict)

    def confirm(self, sent_at: float) -> None:
        """A request sent at `sent_at` (this lease's clock) showed the table now held."""
        if self.confirmed_at is None or sent_at > self.confirmed_at:
            self.confirmed_at = sent_at

    def releasing(self, units: Iterable[str]) -> None:
        """The newest table releases `units` from this worker (and no others): before it is
        confirmed, so that their deadlines count from the confirmation before it."""
        wanted = set(units)
        start = -float("inf") if self.confirmed_at is None else self.confirmed_at
        span = float("inf") if self.duration is None else self.duration
        self.release_deadlines = {
            unit: self.release_deadlines.get(unit, start + span) for unit in wanted
        }

    def expires_at(self, unit: str | None = None) -> float | None:
        """When serving (`unit`, if given) must stop without a new confirmation; None: never."""
        if self.duration is None:
            return None
        if self.confirmed_at is None:
            return -float("inf")
        deadline = self.confirmed_at + self.duration
        if unit is not None and unit in self.release_deadlines:
            deadline = min(deadline, self.release_deadlines[unit])
        return deadline

    def valid(self, unit: str | None = None) -> bool:
        """Whether this worker may serve now (`unit`, if given)."""
        deadline = self.expires_at(unit)
        return deadline is None or self.clock() < deadline

    def renew_interval(self) -> float | None:
        """How often to confirm; None: no need (KeepServing)."""
        return None if self.duration is None else self.duration / RENEWALS_PER_LEASE
