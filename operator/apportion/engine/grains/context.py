"""What a placement call knows about its caller."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PlacementContext:
    """The caller of a placement: built once per worker and reused; `with_call` derives the
    per-call variant when a hint or a local activation count is given.

    Filters see only `local_member` and `caller_metadata` (their results are cached on those);
    `hint` and `local_activations` are read by the strategy on each call.
    """

    local_member: str | None = None
    """The member making the placement (Orleans' local silo)."""
    hint: str | None = None
    """Per-call placement hint: a member name, honoured if it is eligible."""
    caller_metadata: Mapping[str, str] | None = None
    """Metadata filters compare against; None means the local member's labels in the table."""
    local_activations: int = 0
    """StatelessWorker: how many activations of this grain the local member already runs."""
    cache_key: tuple[object, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        metadata = None
        if self.caller_metadata is not None:
            metadata = tuple(sorted(self.caller_metadata.items()))
        object.__setattr__(self, "cache_key", (self.local_member, metadata))

    def with_call(self, *, hint: str | None = None, local_activations: int = 0) -> PlacementContext:
        return dataclasses.replace(self, hint=hint, local_activations=local_activations)
