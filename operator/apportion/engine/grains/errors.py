"""Errors raised by grain placement: bad specs (the user's to fix) and failed placements."""

from __future__ import annotations


class GrainSpecError(ValueError):
    """A GrainType strategy or filter spec that cannot be turned into a strategy."""


class PlacementError(RuntimeError):
    """No member can take a new activation right now."""


class NoCompatibleMember(PlacementError):
    """Filters, roles or load shedding left no member to place on."""


class StatelessWorkerAtCapacity(PlacementError):
    """The local member already runs `max_local` activations of this stateless worker.

    Orleans' answer to this case is "reuse one of the local activations"; the caller does that
    instead of creating a new activation.
    """

    def __init__(self, member: str, max_local: int, local_activations: int) -> None:
        super().__init__(
            f"stateless worker at capacity on {member!r}: {local_activations} local activations,"
            f" maxLocal {max_local}; reuse a local activation"
        )
        self.member = member
        self.max_local = max_local
        self.local_activations = local_activations
