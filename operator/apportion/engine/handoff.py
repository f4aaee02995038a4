"""Fenced hand-off of units between worker pods (docs/handoff.md).

Akka Cluster Sharding's hand-off (BeginHandOff → owner stops the shard → ack → reallocate),
made level-triggered: every decision is re-derived from the published table, the target, the
live pods and their acks, all of which live in the API server, so the operator may crash or
fail over between any two writes. Pure: no I/O, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, TypeGuard

from apportion.api.assignment import (
    UNOWNED,
    Ack,
    AssignmentTable,
    Incarnation,
    Release,
    Suspensions,
    UnitState,
    unit_order,
)
from apportion.api.pods import WorkerPod


class Reason(StrEnum):
    """Event reasons; the controller posts one Event per HandoffEvent."""

    ASSIGNED = "Assigned"
    HANDOFF_STARTED = "HandoffStarted"
    HANDOFF_RETARGETED = "HandoffRetargeted"
    HANDOFF_CANCELLED = "HandoffCancelled"
    HANDOFF_COMPLETED = "HandoffCompleted"
    HANDOFF_TIMED_OUT = "HandoffTimedOut"
    OWNER_GONE = "OwnerGone"
    HELD_FOR_RESTART = "HeldForRestart"
    RESHARDED = "Resharded"


@dataclass(frozen=True)
class HandoffEvent:
    """One decision about a group of units sharing reason, source and target."""

    reason: Reason
    source: str | None
    target: str | None
    units: tuple[str, ...]

    @property
    def type(self) -> Literal["Normal", "Warning"]:
        forced = self.reason is Reason.HANDOFF_TIMED_OUT
        stranded = self.reason is Reason.OWNER_GONE and self.target is None
        return "Warning" if forced or stranded else "Normal"

    def message(self, sample: int = 8) -> str:
        shown = ", ".join(self.units[:sample]) + (", …" if len(self.units) > sample else "")
        what = f"{len(self.units)} unit(s) ({shown})"
        src, dst = self.source, self.target
        nobody = "they wait unowned for its next incarnation (rebalance.restartGrace)"
        match self.reason:
            case Reason.ASSIGNED:
                return f"assigned {what} to {dst}"
            case Reason.HANDOFF_STARTED:
                return f"{src} is releasing {what} for {dst or 'nobody'}"
            case Reason.HANDOFF_RETARGETED if dst is None:
                return f"hand-off of {what} from {src} now goes to nobody: {nobody}"
            case Reason.HANDOFF_RETARGETED:
                return f"hand-off of {what} from {src} now goes to {dst}"
            case Reason.HANDOFF_CANCELLED:
                return f"hand-off of {what} to {dst or 'nobody'} cancelled; {src} keeps them"
            case Reason.HANDOFF_COMPLETED:
                owns = f"{dst} owns them" if dst else nobody
                return f"{src} acknowledged the release of {what}; {owns}"
            case Reason.HANDOFF_TIMED_OUT:
                anyway = f"reassigned to {dst} anyway" if dst else f"{nobody} anyway"
                return (
                    f"{src} did not acknowledge the release of {what} within "
                    f"handoffTimeout; {anyway}"
                )
            case Reason.RESHARDED:
                # source and target hold the old and new unit counts, not pods
                return (
                    f"resharded {src} unit(s) into {what}; each stays on the pod of its "
                    "parent(s) until the rebalance spreads them"
                )
            case Reason.HELD_FOR_RESTART if dst is not None:
                return (
                    f"{src} is leaving and its name comes back: it releases {what} to nobody; "
                    f"{nobody}"
                )
            case Reason.HELD_FOR_RESTART:
                return (
                    f"owner pod {src} is gone; {what} wait unowned for its new incarnation "
                    "(rebalance.restartGrace)"
                )
            case Reason.OWNER_GONE:
                where = f"reassigned to {dst}" if dst else "no member can take them"
                return f"owner pod {src} is gone; {what} {where}"


@dataclass(frozen=True)
class HandoffDecision:
    """`new_table`: publish it (None: the published table stands). `waiting`: units still
    releasing afterwards; `wake_at`: when the first of them times out, to step again then.
    `failing`: waiting units whose owner's ack says its release callback fails (unit → the
    owner's message); the owner retries, `handoffTimeout` still decides."""

    new_table: AssignmentTable | None
    events: tuple[HandoffEvent, ...]
    waiting: tuple[str, ...]
    wake_at: float | None
    failing: Mapping[str, str] = field(default_factory=dict)


def invert_assignment(assignment: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """member → units (a placement Plan's assignment) to the unit → member target of `step`."""
    target: dict[str, str] = {}
    for member, units in assignment.items():
        for unit in units:
            if target.setdefault(unit, member) != member:
                raise ValueError(f"unit {unit!r} assigned to both {target[unit]} and {member}")
    return target


def step(
    published: AssignmentTable,
    target: Mapping[str, str | None],
    acks: Mapping[str, Ack],
    live_members: Mapping[str, WorkerPod],
    now: float,
    handoff_timeout: float,
    *,
    generation: int | None = None,
    releases_known: Mapping[str, float] | None = None,
) -> HandoffDecision:
    """Advance every unit of `published` one move towards `target`; at most one write.

    `target`: unit → desired member; a unit missing from it (or aimed at a pod that is gone or
    draining) has no destination and stays where it is, except one aimed at its own owner while
    that owner is draining: a restart hold on a pod that leaves and whose name comes back
    (`apportion.engine.restarts`), released to nobody, then left unowned. `acks`: pod name →
    the ack parsed from that pod's annotation. `live_members`: every pod of the set present in
    the API.
    `releases_known`: releasing unit → when this operator knew its release was published (the
    write returned, or it read the table back, e.g. on taking over); a release times out only
    `handoff_timeout` after that and after its `since` (docs/handoff.md, the serving lease's
    inequality); a releasing unit missing from it does not time out. None: from `since` alone.
    Same inputs on the table this returns → no further write (the controller just loops).
    """
    if not handoff_timeout > 0:
        raise ValueError("handoff_timeout must be positive")
    epoch = published.epoch + 1
    known_uid = published.member_uids
    vouched = {
        name: ack
        for name, pod in live_members.items()
        if (ack := acks.get(name)) is not None and ack.uid == pod.uid
    }  # an ack speaks only for the pod incarnation that wrote it
    draining = {
        name
        for name, pod in live_members.items()
        if pod.draining or (name in vouched and vouched[name].draining)
    }

    moment = _Moment(published.epoch, epoch, now, handoff_timeout)
    units = dict(published.units)
    changed = False
    grouped: dict[tuple[Reason, str | None, str | None], list[str]] = {}
    waiting: list[str] = []
    failing: dict[str, str] = {}
    wake_at: float | None = None
    order = published.unit_names
    if not target.keys() <= units.keys():
        order = unit_order(units.keys() | target.keys())
    for unit in order:
        state = units.get(unit, UNOWNED)
        wanted = target.get(unit)
        owner = state.owner
        owner_pod = live_members.get(owner) if owner is not None else None
        alive = owner is not None and owner_pod is not None and owner_pod.uid == known_uid[owner]
        park = alive and wanted == owner and owner in draining
        if alive and state.releasing is None and (wanted is None or wanted == owner) and not park:
            continue  # the common case, kept cheap for 100k-unit tables: nothing to do
        destination = wanted if wanted in live_members and wanted not in draining else None
        owner_ack = vouched.get(owner) if alive and owner is not None else None
        timed_from = _counted_from(state, unit, now, releases_known)
        outcome = _advance(state, unit, destination, park, alive, owner_ack, timed_from, moment)
        if outcome is not None:
            state, reason, source, dest = outcome
            units[unit] = state
            changed = True
            grouped.setdefault((reason, source, dest), []).append(unit)
        elif unit not in units:
            units[unit] = state
            changed = True
        if state.releasing is not None:
            waiting.append(unit)
            deadline = _counted_from(state, unit, now, releases_known) + handoff_timeout
            wake_at = deadline if wake_at is None else min(wake_at, deadline)
            why = _failing(owner_ack, unit, state.releasing, published.epoch)
            if why is not None:
                failing[unit] = why

    members = tuple(Incarnation(name, live_members[name].uid) for name in sorted(live_members))
    new_generation = published.generation if generation is None else generation
    changed = changed or members != published.members or new_generation != published.generation
    new_table = None
    if changed:
        new_table = AssignmentTable(
            published.set_ref,
            new_generation,
            published.key_scheme,
            published.count,
            epoch,
            members,
            units,
            published.lineage,
            published.serving_lease,
        )
    events = tuple(
        HandoffEvent(reason, source, dest, tuple(group))
        for (reason, source, dest), group in sorted(grouped.items(), key=_event_key)
    )
    return HandoffDecision(new_table, events, tuple(waiting), wake_at, failing)


def _counted_from(
    state: UnitState, unit: str, now: float, releases_known: Mapping[str, float] | None
) -> float:
    """When the unit's release started counting towards the timeout (`now` if none)."""
    if state.releasing is None:
        return now
    since = state.releasing.since
    return since if releases_known is None else max(since, releases_known.get(unit, now))


@dataclass(frozen=True, slots=True)
class _Moment:
    """What every unit's move in one `step` shares."""

    published_epoch: int
    """The epoch of the table read (acks newer than it are not believed)."""
    epoch: int
    """The epoch of the table this step writes."""
    now: float
    timeout: float
    """The hand-off timeout."""


def _advance(
    state: UnitState,
    unit: str,
    destination: str | None,
    park: bool,
    owner_alive: bool,
    owner_ack: Ack | None,
    timed_from: float,
    moment: _Moment,
) -> tuple[UnitState, Reason, str | None, str | None] | None:
    """The next state of one unit, with why; None when it stays as it is. `timed_from`: when
    the unit's release (if any) started counting towards the timeout. `park`: the owner is alive
    but leaves, and its name comes back, so the unit goes to nobody (`step`)."""
    owner, release = state.owner, state.releasing
    published_epoch, now, epoch = moment.published_epoch, moment.now, moment.epoch
    timed_out = now - timed_from >= moment.timeout
    if park:
        return _park(state, owner_ack, unit, timed_out, moment)
    if owner is None:
        if destination is None:
            return None
        return UnitState(destination, epoch), Reason.ASSIGNED, None, destination
    if not owner_alive:
        # The pod is gone (or replaced by a new incarnation): its deletion is the fence.
        return UnitState(destination, epoch), Reason.OWNER_GONE, owner, destination
    if release is None:
        if destination is None or destination == owner:
            return None
        started = UnitState(owner, state.epoch, Release(destination, now, epoch))
        return started, Reason.HANDOFF_STARTED, owner, destination
    if destination is None or destination == owner:
        return UnitState(owner, state.epoch), Reason.HANDOFF_CANCELLED, owner, release.to
    if _released(owner_ack, unit, release, published_epoch):
        return UnitState(destination, epoch), Reason.HANDOFF_COMPLETED, owner, destination
    if timed_out:
        return UnitState(destination, epoch), Reason.HANDOFF_TIMED_OUT, owner, destination
    if destination != release.to:
        # Keep since and epoch: the owner's release (and any ack of it) does not depend on
        # where the unit goes next.
        moved = UnitState(owner, state.epoch, Release(destination, release.since, release.epoch))
        return moved, Reason.HANDOFF_RETARGETED, owner, destination
    return None


def _park(
    state: UnitState, owner_ack: Ack | None, unit: str, timed_out: bool, moment: _Moment
) -> tuple[UnitState, Reason, str | None, str | None] | None:
    """A leaving owner's unit held for its next incarnation: released to nobody, then unowned.
    The release is the fence, as for any hand-off; the next incarnation acquires the unit under
    a newer epoch, like any newcomer."""
    owner, release, epoch = state.owner, state.releasing, moment.epoch
    if release is None:
        parked = UnitState(owner, state.epoch, Release(None, moment.now, epoch))
        return parked, Reason.HELD_FOR_RESTART, owner, owner
    if _released(owner_ack, unit, release, moment.published_epoch):
        return UnitState(None, epoch), Reason.HANDOFF_COMPLETED, owner, None
    if timed_out:
        return UnitState(None, epoch), Reason.HANDOFF_TIMED_OUT, owner, None
    if release.to is not None:
        # Keep since and epoch, as any retarget: the owner's release does not depend on it.
        parked = UnitState(owner, state.epoch, Release(None, release.since, release.epoch))
        return parked, Reason.HANDOFF_RETARGETED, owner, None
    return None


def _speaks_for(ack: Ack | None, release: Release, published_epoch: int) -> TypeGuard[Ack]:
    """The owner's (vouched) ack is about this release: written after the owner saw the release
    (an older ack predates it), not newer than the table we read (else our read is stale)."""
    return ack is not None and release.epoch <= ack.epoch <= published_epoch


def _released(ack: Ack | None, unit: str, release: Release, published_epoch: int) -> bool:
    """The owner's ack covers this release: about it, and the unit is no longer pending."""
    return _speaks_for(ack, release, published_epoch) and unit not in ack.pending


def _failing(ack: Ack | None, unit: str, release: Release, published_epoch: int) -> str | None:
    """Why the owner's release callback fails for this unit, when its ack about this release
    says so (a failing unit is still pending: anything else contradicts itself and is ignored)."""
    if not _speaks_for(ack, release, published_epoch) or unit not in ack.pending:
        return None
    return ack.failing.get(unit)


def _event_key(item: tuple[tuple[Reason, str | None, str | None], list[str]]) -> tuple[str, ...]:
    (reason, source, target), _ = item
    return (reason.value, source or "", target or "")


# ------------------------------------------------------------------------------- worker side


@dataclass(frozen=True)
class WorkerSteps:
    """What a worker does on a table newer than the last one it handled.

    acquire: start serving, under fencing token `table.units[u].epoch` (load state afresh).
    release: take no new work, finish or buffer, then ack. stop: drop at once, without an ack:
    the unit was taken away without this worker's ack (it was presumed gone, or the hand-off
    timed out), possibly given back since under a newer token, in which case it is in
    `acquire` too. A unit being finished for a release that the table shows as owned again
    (hand-off cancelled) simply goes on being served.
    """

    acquire: frozenset[str]
    release: frozenset[str]
    stop: frozenset[str]


def _incarnation(table: AssignmentTable, me: Incarnation) -> bool:
    return table.member_uids.get(me.name) == me.uid


def owned_units(table: AssignmentTable, me: Incarnation) -> frozenset[str]:
    """Units `me` may take new work for: owner is this very pod incarnation, no release."""
    if not _incarnation(table, me):
        return frozenset()
    return frozenset(
        unit
        for unit, state in table.units.items()
        if state.owner == me.name and state.releasing is None
    )


def releasing_units(table: AssignmentTable, me: Incarnation) -> frozenset[str]:
    """Units `me` still nominally owns but must release and acknowledge."""
    if not _incarnation(table, me):
        return frozenset()
    return frozenset(
        unit
        for unit, state in table.units.items()
        if state.owner == me.name and state.releasing is not None
    )


def is_owner(table: AssignmentTable, me: Incarnation, unit: str) -> bool:
    state = table.units.get(unit)
    return (
        state is not None
        and state.owner == me.name
        and state.releasing is None
        and _incarnation(table, me)
    )


def plan_worker(table: AssignmentTable, me: Incarnation, serving: Mapping[str, int]) -> WorkerSteps:
    """The worker rule. `serving`: unit → fencing token, for every unit this process serves
    now, including ones it is finishing for a release. Serve a unit only while the table says
    it is yours under the token you acquired it with."""
    kept = {
        unit
        for unit, token in serving.items()
        if (state := table.units.get(unit)) is not None and state.epoch == token
    }
    owned = owned_units(table, me)
    releasing = releasing_units(table, me)
    return WorkerSteps(
        acquire=frozenset(owned - kept),
        release=frozenset(releasing & kept),
        stop=frozenset(serving.keys() - (kept & (owned | releasing))),
    )


def make_ack(
    table: AssignmentTable,
    me: Incarnation,
    *,
    pending: Iterable[str] = (),
    draining: bool = False,
    failing: Mapping[str, str] | None = None,
    suspended: Suspensions | None = None,
) -> Ack:
    """The ack to write after handling `table`: every unit it marks releasing from `me` is
    released except `pending` (units still finishing); `failing`: those of them whose release
    callback failed and is being retried, with why; `suspended`: the serving lease's outages."""
    still = frozenset(pending) & releasing_units(table, me)
    return Ack(
        uid=me.uid,
        epoch=table.epoch,
        pending=still,
        draining=draining,
        failing={unit: why for unit, why in (failing or {}).items() if unit in still},
        suspended=suspended,
    )


def supersedes(new: AssignmentTable, old: AssignmentTable | None) -> bool:
    """Whether a worker should act on `new` after `old`: epochs only move forward within one
    set incarnation; a recreated set (new uid) starts over."""
    return old is None or new.set_ref.uid != old.set_ref.uid or new.epoch > old.epoch


# --- When the table itself is lost ----------------------------------------------------------


class TableDamage(StrEnum):
    """What happened to the published table, as the condition and Event reason."""

    LOST = "AssignmentTableLost"
    UNREADABLE = "AssignmentTableUnreadable"
    ROLLED_BACK = "AssignmentTableRolledBack"
    TAMPERED = "AssignmentTableTampered"


@dataclass(frozen=True, slots=True)
class Recovery:
    """The table to write at once in place of a damaged one."""

    damage: TableDamage
    table: AssignmentTable
    fenced: bool
    """No copy of the last table survived: every unit is unowned (the fence) and stays so until
    `handoffTimeout` has passed, by which time a worker that still serves what it was given must
    have seen the fence and stopped (the same allowance as a timed-out hand-off)."""
    message: str


def recover(
    found: AssignmentTable | None,
    unreadable: str | None,
    *,
    published: int,
    reserved: int,
    remembered: AssignmentTable | None,
    template: AssignmentTable,
    acked: int = 0,
) -> Recovery | None:
    """None when `found` (the table read back) may be continued from; else what to write.

    `reserved`: the epoch the operator reserved in its status before its last write (so the
    status outlives the table); no table above it is the operator's, and one below it was rolled
    back — or its write failed, which the remembered table tells apart. `published`: the epoch
    the status last reported as published. `remembered`: the last table this operator wrote or
    read intact, if it still has it. `template`: an unowned table of the set's current shape
    (the fence is made from it). `acked`: the highest epoch a live worker acknowledged. No
    table above the reservation was ever the operator's, so a worker that processed one saw
    the API server before it went back (etcd restored from a backup, which rolls the table,
    the status and the acks back at once): what the workers serve is newer than any copy
    here, and epochs up to `acked` have been seen.

    A table gone, unreadable, rolled back or tampered with is replaced at an epoch above every
    epoch that may have been used: by the remembered table's owners — what the workers serve —
    so nothing moves, or else by the fence. Epochs are never reused: a worker ignores a table
    whose epoch it has seen, so a reused epoch would leave it serving what the new table gives
    to another pod.
    """
    if remembered is not None and remembered.set_ref.uid != template.set_ref.uid:
        remembered = None
    known = max([reserved, published, *(t.epoch for t in (found, remembered) if t is not None)])
    high = max(known, acked)
    if acked > known:
        damage = TableDamage.ROLLED_BACK
        why = (
            f"a worker acknowledged epoch {acked}, above every epoch the cluster holds ({known}):"
            " the API server's objects went back, restored from a backup"
        )
        remembered = None  # older than what the workers serve
    elif unreadable is not None:
        damage, why = TableDamage.UNREADABLE, unreadable
    elif found is None:
        if high == 0:
            return None  # a new set: nothing was ever published
        damage, why = TableDamage.LOST, f"the table is gone (epoch {high} was reserved)"
    elif remembered is not None and found.epoch < remembered.epoch:
        damage = TableDamage.ROLLED_BACK
        why = f"the table went back to epoch {found.epoch} after epoch {remembered.epoch}"
    elif remembered is None and found.epoch < max(reserved, published):
        # Without a copy, a table below the reservation cannot be told from a rolled-back one
        # (or from the table before a write that failed): its owners may be stale.
        damage = TableDamage.ROLLED_BACK
        why = f"the table is at epoch {found.epoch}, below epoch {max(reserved, published)}"
    elif (reserved and found.epoch > reserved) or (
        remembered is not None and found.epoch == remembered.epoch and found != remembered
    ):
        damage = TableDamage.TAMPERED
        why = f"epoch {found.epoch} was not written by the operator"
    else:
        return None
    epoch = high + 1
    if remembered is not None:
        table = AssignmentTable(
            remembered.set_ref,
            remembered.generation,
            remembered.key_scheme,
            remembered.count,
            epoch,
            remembered.members,
            remembered.units,
            serving_lease=remembered.serving_lease,
        )
        what = f"republished the owners of epoch {remembered.epoch} as epoch {epoch}"
        return Recovery(damage, table, fenced=False, message=f"{why}: {what}")
    fence = AssignmentTable(
        template.set_ref,
        template.generation,
        template.key_scheme,
        template.count,
        epoch,
        (),
        {unit: UnitState(None, epoch) for unit in template.units},
        serving_lease=template.serving_lease,
    )
    what = (
        f"no copy survived: every unit is unowned at epoch {epoch} until the workers have had "
        "handoffTimeout to stop serving"
    )
    return Recovery(damage, fence, fenced=True, message=f"{why}: {what}")
