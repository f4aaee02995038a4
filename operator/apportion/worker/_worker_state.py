"""What one worker process holds of one set, and what it must do next (pure, no I/O).

The worker rule is `apportion.engine.handoff.plan_worker`; this class adds what a live process
needs around it: callbacks take time, so a unit whose callback is still running is *busy* and
left out of new plans until the callback returns (a unit is never acquired and released at the
same time); tables keep arriving meanwhile, and fencing (`owns`) always follows the newest one;
acknowledgements are written only when they say something the last one did not.

A release whose callback fails is not acknowledged: the unit stays held and busy (pending in
every ack, listed under `failing` with why) while the worker retries it, until the callback
succeeds or the view no longer grants the unit to this process (`retry_wanted`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from apportion.api.assignment import Ack, AssignmentTable, Incarnation, Suspensions
from apportion.engine.handoff import (
    is_owner,
    make_ack,
    owned_units,
    plan_worker,
    releasing_units,
    supersedes,
)
from apportion.engine.reshard import hash_range, reshape

_FOREIGN_TOKEN = -1
"""Token of units held under an earlier incarnation of the set: matches no unit epoch."""
FAILING_MESSAGE_LIMIT = 200
"""Characters of a failing release's message kept for the ack (a Pod's annotations share
256 KiB)."""


@dataclass(frozen=True, slots=True)
class UnitRange:
    """Unit `unit` of `count` and the 64-bit key hashes `[lo, hi)` it holds (keyScheme
    apportion: `(xxh3_64(key) · count) >> 64 == unit` exactly when `lo ≤ hash < hi`)."""

    unit: str
    count: int
    lo: int
    hi: int

    @classmethod
    def of(cls, unit: str, count: int) -> UnitRange:
        return cls(unit, count, *hash_range(int(unit), count))


@dataclass(frozen=True)
class Resharding:
    """The local state to split or merge in place when the count changes (docs/resharding.md).

    `carried`: new unit → the old units (of `from_count`) whose in-memory state it takes over;
    `load`: new unit → old units whose state is not here and must be loaded as on acquire (a
    merge sibling this process did not hold)."""

    from_count: int
    to_count: int
    carried: Mapping[str, tuple[str, ...]]
    load: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def split(self) -> bool:
        return self.to_count > self.from_count

    def splits(self) -> dict[UnitRange, tuple[UnitRange, ...]]:
        """parent → the children this process serves from now on (split)."""
        result: dict[UnitRange, list[UnitRange]] = {}
        for child, (parent,) in sorted(self.carried.items(), key=lambda kv: int(kv[0])):
            result.setdefault(UnitRange.of(parent, self.from_count), []).append(
                UnitRange.of(child, self.to_count)
            )
        return {parent: tuple(children) for parent, children in result.items()}

    def merges(self) -> dict[UnitRange, tuple[tuple[UnitRange, ...], tuple[UnitRange, ...]]]:
        """merged unit → (siblings held here, siblings to load) (merge)."""
        return {
            UnitRange.of(unit, self.to_count): (
                tuple(UnitRange.of(u, self.from_count) for u in held),
                tuple(UnitRange.of(u, self.from_count) for u in self.load.get(unit, ())),
            )
            for unit, held in self.carried.items()
        }


@dataclass(frozen=True)
class Transition:
    """Callbacks to run for one step, all under the view of `epoch`.

    Run `stop` first (taken away without a hand-off: drop at once), then `acquire` and `release`
    (finish or buffer, then acknowledge). `tokens`: the fencing token of each acquired unit.
    """

    epoch: int
    acquire: frozenset[str]
    release: frozenset[str]
    stop: frozenset[str]
    tokens: dict[str, int]
    resharding: Resharding | None = None


class WorkerState:
    """One worker process's view of one PartitionSet or ShardSet.

    `view`: the newest table received; `held`: unit → fencing token for every unit this process
    serves or is finishing (acquired, not yet released or stopped); `busy`: units whose callback
    is running (or being retried); `failing`: units whose release callback failed → why.
    """

    def __init__(self, me: Incarnation, kind: str, namespace: str, name: str) -> None:
        self.me = me
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.view: AssignmentTable | None = None
        self.held: dict[str, int] = {}
        self.held_count: int | None = None  # the unit count `held` is named in
        self.busy: set[str] = set()
        self.failing: dict[str, str] = {}
        self.suspensions: Suspensions | None = None
        self.draining = False
        self.written: Ack | None = None
        self.rewound = False
        """The API server went back in time (etcd restored from a backup) since the last ack."""
        self.names_set = False
        """Every ack names the set since the API server went back: a later ack must not take
        back what the first told an operator that has not read it yet."""

    # --------------------------------------------------------------------------------- tables

    def receive(self, table: AssignmentTable) -> bool:
        """Take `table` as the view if it belongs to this set and supersedes the view; whether
        it did. Raises ValueError for a table of another set."""
        ref = table.set_ref
        if (ref.kind, ref.namespace, ref.name) != (self.kind, self.namespace, self.name):
            raise ValueError(
                f"table of {ref.kind} {ref.namespace}/{ref.name}, "
                f"not of {self.kind} {self.namespace}/{self.name}"
            )
        if not supersedes(table, self.view):
            view = self.view
            if view is not None and ref.uid == view.set_ref.uid and table.epoch < view.epoch:
                self.went_back()  # the operator never lowers an epoch: a restore did
            return False
        if self.view is not None and ref.uid != self.view.set_ref.uid:
            # A recreated set: unit epochs start over, so a held token could match by chance.
            self.held = dict.fromkeys(self.held, _FOREIGN_TOKEN)
        self.view = table
        return True

    @property
    def epoch(self) -> int:
        """Epoch of the view (0 before the first table)."""
        return 0 if self.view is None else self.view.epoch

    def next_transition(self) -> Transition | None:
        """The callbacks due now, marking their units busy and `held` as they will be; None when
        there is nothing to do. Call again whenever a table arrives or a callback returns."""
        if self.view is None:
            return None
        if self.held_count != self.view.count:
            if self.busy:
                return None  # reshape only between callbacks: `held` must be settled
            return self._reshape(self.view)
        plan = plan_worker(self.view, self.me, self.held)
        stop = plan.stop - self.busy
        release = plan.release - self.busy
        acquire = plan.acquire - self.busy
        if not (stop or release or acquire):
            return None
        for unit in stop:
            del self.held[unit]
        tokens = {unit: self.view.units[unit].epoch for unit in acquire}
        self.held.update(tokens)
        self.busy |= stop | release | acquire
        return Transition(self.view.epoch, acquire, release, stop, tokens)

    def _reshape(self, view: AssignmentTable) -> Transition | None:
        """The count changed: carry what `reshape` allows, stop the rest (the next transition
        acquires afresh whatever is left)."""
        change = (
            None if self.held_count is None else reshape(view, self.me, self.held_count, self.held)
        )
        previous, self.held_count = self.held_count, view.count
        if change is None or previous is None:
            return self.next_transition()
        self.held = dict(change.serving)
        self.busy |= change.serving.keys()
        resharding = Resharding(previous, view.count, change.carried, change.load)
        return Transition(view.epoch, frozenset(), frozenset(), change.dropped, {}, resharding)

    def resharded(self, units: Iterable[str], *, ok: bool = True) -> None:
        """The split or merge callbacks returned (ok) or raised: then the units are dropped and
        the next transition acquires them afresh."""
        self.acquired(units, ok=ok)

    def stopped(self, units: Iterable[str]) -> None:
        self.busy.difference_update(units)

    def acquired(self, units: Iterable[str], *, ok: bool = True) -> None:
        """on_acquire returned (ok) or raised: then the units are not served, and the next
        table retries them."""
        for unit in units:
            self.busy.discard(unit)
            if not ok:
                self.held.pop(unit, None)

    def released(self, units: Iterable[str]) -> None:
        for unit in units:
            self.busy.discard(unit)
            self.held.pop(unit, None)
            self.failing.pop(unit, None)

    def release_failed(self, units: Iterable[str], why: str) -> None:
        """on_release raised: the units stay held and busy, unacknowledged, while the worker
        retries them; the ack lists them as failing with `why`."""
        message = why[:FAILING_MESSAGE_LIMIT]
        for unit in units:
            self.failing[unit] = message

    def retry_wanted(self, units: Iterable[str]) -> frozenset[str]:
        """Of `units`, whose release failed, those to try again: the view still names this
        process their owner under the token it holds (releasing, or given back: a release
        half done is finished before the unit is acquired afresh). The others were taken away
        (a revoke, `handoffTimeout`) or renamed by a change of count: give them up."""
        if self.view is None or self.held_count != self.view.count:
            return frozenset()
        tried = {unit: self.held[unit] for unit in units if unit in self.held}
        return frozenset(tried.keys() - plan_worker(self.view, self.me, tried).stop)

    def release_abandoned(self, units: Iterable[str]) -> None:
        """The worker stopped retrying: the units are no longer busy but still held, so the
        next transition stops them (on_revoke) or the change of count reshapes them."""
        for unit in units:
            self.busy.discard(unit)
            self.failing.pop(unit, None)

    def drop_all(self) -> frozenset[str]:
        """Everything still held, given up (process exit); no acknowledgement covers it."""
        units = frozenset(self.held)
        self.held.clear()
        self.busy.clear()
        self.failing.clear()
        return units

    # -------------------------------------------------------------------------------- fencing

    def owns(self, unit: str) -> bool:
        """Whether to take new work for `unit` now: the view grants it to this incarnation,
        unreleased, under the token this process acquired it with, and its acquisition is done."""
        token = self.held.get(unit)
        return (
            token is not None
            and unit not in self.busy
            and self.view is not None
            and is_owner(self.view, self.me, unit)
            and self.view.units[unit].epoch == token
        )

    def my_units(self) -> frozenset[str]:
        return frozenset(unit for unit in self.held if self.owns(unit))

    def token(self, unit: str) -> int | None:
        """The fencing token (epoch of assignment) of a unit this process holds — acquiring,
        serving or releasing it — else None."""
        return self.held.get(unit)

    # ---------------------------------------------------------------------------------- acks

    def went_back(self) -> None:
        """The API server's objects went back to an earlier state (an etcd restore): the ack on
        the Pod may be an older one, and the operator may not know the epochs this process has
        seen. The next ack is written whatever the last one said (docs/handoff.md, "When the
        cluster is restored from a backup")."""
        self.written = None
        self.rewound = self.names_set = True

    def start_draining(self) -> None:
        self.draining = True

    def resumed(self, suspended_seconds: float) -> None:
        """The serving lease holds again after running out for `suspended_seconds`: the next ack
        says so, for the operator to report what nobody could write while it lasted."""
        count = 1 if self.suspensions is None else self.suspensions.count + 1
        self.suspensions = Suspensions(count, suspended_seconds)

    def ack_due(self) -> Ack | None:
        """The ack to write now, or None when the last one written says it all already."""
        written = self._written_by_me()
        # Also when an earlier process of this very pod left a draining mark behind.
        flag_stale = (written is not None and written.draining) != self.draining
        if self.view is None:
            return Ack(uid=self.me.uid, epoch=0, draining=self.draining) if flag_stale else None
        if self.held and self.held_count != self.view.count:
            # `held` is named in the previous count until the reshape: an ack now would call a
            # new unit released whose state is still in its parents here, not handed over.
            return None
        ack = make_ack(
            self.view,
            self.me,
            pending=self.held,
            draining=self.draining,
            failing=self.failing,
            suspended=self.suspensions,
        )
        if self.names_set:
            ack = replace(ack, set_uid=self.view.set_ref.uid)
        released = releasing_units(self.view, self.me) - ack.pending
        # A change in which releases fail is news for the operator; a new message alone is not
        # (that would be a Pod write per retry).
        failing_changed = ack.failing.keys() != (written.failing.keys() if written else set())
        news = failing_changed or ack.suspended != (written.suspended if written else None)
        if self.rewound or flag_stale or news:
            return ack
        if any(not self._covers(written, u) for u in released):
            return ack
        return None

    def ack_written(self, ack: Ack) -> None:
        self.written = ack
        self.rewound = False

    def _written_by_me(self) -> Ack | None:
        """The ack on the Pod, if this pod incarnation wrote it (an ack speaks for its uid)."""
        written = self.written
        return written if written is not None and written.uid == self.me.uid else None

    def _covers(self, written: Ack | None, unit: str) -> bool:
        assert self.view is not None
        release = self.view.units[unit].releasing
        assert release is not None
        return (
            written is not None
            and release.epoch <= written.epoch <= self.view.epoch
            and unit not in written.pending
        )

    def drained(self) -> bool:
        """Draining is done: nothing held, nothing owned in the view, every release acked."""
        if self.held or self.busy:
            return False
        if self.view is None:
            return self.ack_due() is None
        return not owned_units(self.view, self.me) and self.ack_due() is None
