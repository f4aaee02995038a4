"""When a candidate placement table is written: urgent changes (spec, membership) at once, load
changes beyond the hysteresis at most once per `minInterval`, noise never. Pure; the clock is
passed in."""

from __future__ import annotations

from dataclasses import dataclass

from apportion.api.placement_table import (
    PlacementTableDocument,
    TableChange,
    classify_change,
)


@dataclass(frozen=True, slots=True)
class Decision:
    change: TableChange
    write: bool
    retry_in: float | None = None
    """Seconds until a held-back load change may be written; None when nothing waits."""

    def next_pass(self, interval: float) -> float:
        """Seconds until the next pass although nothing changes: `publish.interval`, sooner
        when a held-back load change comes due."""
        return interval if self.retry_in is None else min(interval, self.retry_in)


class PublishGate:
    """Remembers the last table written and when."""

    def __init__(
        self,
        published: PlacementTableDocument | None = None,
        *,
        version_floor: int = 0,
    ) -> None:
        self.published = published
        self.version_floor = version_floor
        self.last_write: float | None = None

    def consider(
        self,
        candidate: PlacementTableDocument,
        now: float,
        *,
        min_interval: float,
        hysteresis_percent: int,
    ) -> Decision:
        change = classify_change(self.published, candidate, hysteresis_percent)
        if not change.kind:
            return Decision(change, write=False)
        if change.urgent or self.last_write is None:
            return Decision(change, write=True)
        wait = self.last_write + min_interval - now
        if wait <= 0:
            return Decision(change, write=True)
        return Decision(change, write=False, retry_in=wait)

    def written(self, doc: PlacementTableDocument, now: float) -> None:
        self.published = doc
        self.last_write = now

    @property
    def next_version(self) -> int:
        published = 0 if self.published is None else self.published.version
        return max(published, self.version_floor) + 1
