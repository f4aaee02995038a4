"""What `explain` returns: the same decision `place` makes, with its reasons recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .filters import FilterStep


@dataclass(frozen=True, slots=True)
class CandidateScore:
    """A member the strategy looked at. `score` is what it compared (lower wins for the load
    strategies); `detail` holds the terms behind it."""

    member: str
    score: float | None = None
    detail: dict[str, float] = field(default_factory=dict)


class Trace:
    """Recorder a strategy fills when (and only when) it is explaining. `place` passes None, so
    the hot path pays a single `is not None` test per record site."""

    __slots__ = ("candidates", "excluded", "notes")

    def __init__(self) -> None:
        self.candidates: list[CandidateScore] = []
        self.excluded: dict[str, str] = {}
        self.notes: list[str] = []

    def consider(self, member: str, score: float | None = None, **detail: float) -> None:
        self.candidates.append(CandidateScore(member, score, detail))

    def exclude(self, member: str, reason: str) -> None:
        self.excluded[member] = reason

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass(frozen=True, slots=True)
class Explanation:
    grain_id: str
    strategy: str
    chosen: str | None
    """The member a new activation would go to now; None when placement fails (see `error`)."""
    error: str | None
    table_version: str
    members: tuple[str, ...]
    filters: tuple[FilterStep, ...]
    excluded: dict[str, str]
    """Members the strategy itself ruled out (overloaded, no statistics, other role)."""
    candidates: tuple[CandidateScore, ...]
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """camelCase, JSON-ready."""
        return {
            "grainId": self.grain_id,
            "strategy": self.strategy,
            "chosen": self.chosen,
            "error": self.error,
            "tableVersion": self.table_version,
            "members": list(self.members),
            "filters": [
                {"filter": s.filter, "kept": list(s.kept), "removed": list(s.removed)}
                for s in self.filters
            ],
            "excluded": dict(self.excluded),
            "candidates": [
                {"member": c.member, "score": c.score, "detail": dict(c.detail)}
                for c in self.candidates
            ],
            "notes": list(self.notes),
        }
