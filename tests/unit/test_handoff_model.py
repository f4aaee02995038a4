"""Model-based test of the hand-off protocol: operator, workers, acks, crashes and delays.

The API server holds the published tables (their whole history, so that a worker may see any
stale version) and the pods with their ack annotations. The operator is stateless, as the real
one: each step re-reads everything, so an operator crash or a failover to a standby (whose clock
may differ) is just a step that did not happen. Workers observe tables late and in order, write
acks that land late and out of order (possibly on a newer pod with the same name), crash and
restart, and are deleted or replaced by a new incarnation of the same name.

The table itself is under attack too (docs/handoff.md, "When the table is lost"): the ConfigMap
is deleted, garbled or rolled back to any earlier table; the operator's memory of its last table
dies with it (a restart); the status — epoch reservation, published epoch, fence — survives, but
the published epoch may lag the table (the operator died between the two writes). The
operator's side is the code the operator runs: `engine.handoff.step` for each pass and
`engine.set_state.SetState` for what it carries between passes (repair, reservation, fence).

The whole cluster goes back in time too (docs/handoff.md, "When the cluster is restored from a
backup"): etcd restored from an earlier backup puts back the table, the status and the pods'
acks as they were, all at once, while the workers keep serving what they saw since and the
operator keeps its memory (it runs through the restore, as Kubernetes' procedure leaves it). A
worker notices (an older table, or its watch finds the server behind it) and writes its ack
again naming the set. The operator may restart before it repaired the table only while a live
worker knows the newest epoch, only after the workers noticed, and its first pass reads their
acks: the window docs/handoff.md states (otherwise its first table could reuse an epoch nobody
alive has seen).

Pods restart in place too (rebalance.restartGrace, `engine.restarts`): a pod without a running
process is NotReady, and a member that is NotReady or gone (a StatefulSet ordinal, p0 and p1;
p2 is one scaled in, never waited for) has its units held for it until RESTART_GRACE has passed:
kept on the restarting pod, or unowned for its next incarnation, whatever the target says.
"""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from apportion.api.assignment import Ack, AssignmentTable, Incarnation, ResourceRef
from apportion.api.pods import WorkerPod
from apportion.engine.handoff import (
    HandoffDecision,
    Reason,
    is_owner,
    make_ack,
    owned_units,
    plan_worker,
    releasing_units,
    step,
    supersedes,
)
from apportion.engine.restarts import held_target, track_holds
from apportion.engine.set_state import SetState

UNITS = ("0", "1", "2")
NAMES = ("p0", "p1", "p2")
TIMEOUT = 10.0
RESTART_GRACE = 15.0
RETURNING = frozenset({"p0", "p1"})
"""StatefulSet ordinals below replicas: a new incarnation of these names is waited for."""
SET = ResourceRef("ShardSet", "ns", "model", "set-uid")
TEMPLATE = AssignmentTable.initial(SET, generation=1, key_scheme="akka", count=len(UNITS))
GARBLED = "not a table"

names = st.sampled_from(NAMES)


@dataclass
class Pod:
    uid: str
    terminating: bool = False  # deletionTimestamp set, SIGTERM sent
    annotation: Ack | None = None


@dataclass(frozen=True)
class Backup:
    """What an etcd backup holds of the model: the table, the status, each pod's ack."""

    stored: AssignmentTable | str | None
    status: dict[str, Any]
    acks: dict[str, tuple[str, Ack | None]]  # pod name → (uid, annotation)


@dataclass
class Process:
    """A running worker container: what it serves and the fencing token it acquired under."""

    me: Incarnation
    view: AssignmentTable
    serving: dict[str, int] = field(default_factory=dict)
    finishing: set[str] = field(default_factory=set)
    draining: bool = False
    names_set: bool = False  # it saw the cluster go back: its acks name the set


class HandoffModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # Every table the operator wrote, in order: what workers may observe.
        self.history = [TEMPLATE]
        # What the ConfigMap holds now: the last table written, or what someone made of it.
        self.stored: AssignmentTable | str | None = TEMPLATE
        # The set's status survives everything: reservedEpoch and fencedUntil written before
        # each table, epoch after it (it may lag). The operator's own state is the engine's
        # SetState, lost when the operator restarts and read back from the status.
        self.status: dict[str, Any] = {"reservedEpoch": 0, "epoch": 0, "fencedUntil": None}
        self.state = SetState.from_status(self.status)
        # Tokens below the last fence's epoch were handed out by tables nobody remembered: a
        # process may still serve (or even acquire, from a stale table) under one until it sees
        # the fence, as after a timed-out hand-off.
        self.fenced_below = 0
        self.pods: dict[str, Pod] = {}
        self.procs: dict[str, Process] = {}
        self.in_flight: list[tuple[str, Ack]] = []
        self.target: dict[str, str] = {}
        self.now = 0.0
        self.uids = itertools.count()
        # (unit, pod uid, unit epoch) whose owner lost the unit to handoffTimeout while alive
        self.forced: set[tuple[str, str, int]] = set()
        # (unit, unit epoch) → the one pod incarnation that ever acquired it under that epoch
        self.token_holders: dict[tuple[str, int], str] = {}
        self.backups: list[Backup] = []
        # Processes that have not noticed the last restore yet; an operator that restarted
        # after it waits for them.
        self.unaware: set[str] = set()
        self.restore_unrepaired = False
        self.restored_at = 0  # history index of the first table written after the last restore

    @property
    def latest(self) -> AssignmentTable:
        return self.history[-1]

    def observable(self) -> list[AssignmentTable]:
        """The tables a worker may still read: after a restore, what it put back and what was
        written since; the tables written between the backup and the restore are gone."""
        since = self.history[self.restored_at :]
        stored = self.stored
        if self.restore_unrepaired and isinstance(stored, AssignmentTable):
            return [stored, *since]
        return since if self.restored_at else self.history

    def catch_up(self, name: str) -> None:
        """The worker handles the newest table it can read, if that is news to it."""
        newest = self.observable()[-1:] or [self.procs[name].view]
        if supersedes(newest[0], self.procs[name].view):
            self.handle(name, newest[0])

    # ------------------------------------------------------------------------------ operator

    def write(self, table: AssignmentTable, now: float, status_written: bool = True) -> None:
        """Reserve the epoch in the status, write the table, then report it in the status."""
        assert table.epoch > max(t.epoch for t in self.history), "an epoch used twice"
        self.restore_unrepaired = False
        self.status.update(self.state.reservation(table) or {})
        self.stored = table
        self.state.written(table, now)
        self.history.append(table)
        if status_written:
            self.status["epoch"] = table.epoch

    def repair(self, now: float) -> bool:
        """The operator reads the table back; True when it had to repair it."""
        stored = self.stored
        found = stored if isinstance(stored, AssignmentTable) else None
        unreadable = GARBLED if stored == GARBLED else None
        acked = max(
            (
                p.annotation.epoch
                for p in self.pods.values()
                if p.annotation is not None
                and p.annotation.uid == p.uid
                and p.annotation.set_uid == SET.uid
            ),
            default=0,
        )
        table, fixed = self.state.resume(
            found, unreadable, self.status, TEMPLATE, now, TIMEOUT, acked=acked
        )
        if fixed is None:
            return False
        event(fixed.damage.value + (" (fenced)" if fixed.fenced else " (from memory)"))
        if "a worker acknowledged" in fixed.message:
            event("a restore told by a worker's ack")
        if fixed.fenced:
            self.fenced_below = table.epoch
        self.write(table, now)
        return True

    def operator_step(self, now: float) -> HandoffDecision | None:
        if self.repair(now):
            return None
        if self.state.fence(now) is not None:
            return None
        published = self.state.remembered or self.latest
        assert published is self.stored or published == self.stored
        live = {
            n: WorkerPod(n, p.uid, terminating=p.terminating, ready=n in self.procs)
            for n, p in self.pods.items()
        }
        acks = {n: p.annotation for n, p in self.pods.items() if p.annotation is not None}
        pods = list(live.values())
        holds = track_holds(
            self.state.restart_holds, published, pods, now, RESTART_GRACE, RETURNING.__contains__
        )
        self.state.note_holds(holds, RESTART_GRACE)
        if holds:
            event("units held for a restart")
        for name in holds:
            pod = self.pods.get(name)
            if pod is None:
                event("units held for a pod gone")
            elif published.member_uids.get(name) != pod.uid:
                event("units held for a new incarnation")
            elif pod.terminating:
                event("units held for a pod leaving (released to nobody)")
            else:
                event("units held for a NotReady pod")
        target = {**self.target, **held_target(holds, pods)}
        decision = step(published, target, acks, live, now, TIMEOUT)
        new = decision.new_table
        if new is None:
            return decision
        assert new.epoch == published.epoch + 1
        assert step(new, target, acks, live, now, TIMEOUT).new_table is None, (
            "same inputs must not cause a second write"
        )
        for happened in decision.events:
            event(happened.reason.value)  # scenario coverage: --hypothesis-show-statistics
            if happened.reason is Reason.HANDOFF_TIMED_OUT:
                for unit in happened.units:
                    old = published.units[unit]
                    assert old.owner is not None
                    self.forced.add((unit, published.member_uids[old.owner], old.epoch))
        self.write(new, now, status_written=self.status_follows)
        return decision

    @initialize(
        pods=st.sets(names, min_size=1),
        wanted=st.dictionaries(st.sampled_from(UNITS), names),
        restart=st.sampled_from([True, True, True, False]),
    )
    def fleet(self, pods: set[str], wanted: dict[str, str], restart: bool) -> None:
        """The first placement, and most often a container restart of an owner right after it:
        restarts then overlap everything the rules do next."""
        for name in sorted(pods):
            self.create_pod(name)
        self.target = wanted
        self.operator_step(self.now)
        owners = sorted({o for o in self.latest.owners().values() if o is not None})
        if restart and owners:
            self.container_restarts(owners[0], watch_fired=True)

    status_follows = True

    @rule(skew=st.sampled_from([0.0, 0.0, -3.0, 3.0]), status_written=st.booleans())
    def operator(self, skew: float, status_written: bool) -> None:
        self.status_follows = status_written
        self.operator_step(self.now + skew)
        self.status_follows = True

    # ------------------------------------------------------------------------ table attacks

    @precondition(lambda self: not self.restore_unrepaired or self.newest_epoch_known_alive())
    @rule()
    def operator_restarts(self) -> None:
        self.state = SetState.from_status(self.status)
        if self.restore_unrepaired:
            # The workers noticed first: at their watch's first reconnect after the restore,
            # seconds, before a restarted operator's first pass (docs/handoff.md).
            event("operator restarted after a restore, before repairing")
            for name in sorted(self.unaware & self.procs.keys()):
                self.write_ack(name, lands_now=True, rewound=True)
            self.unaware.clear()
            # ... and its first pass reads those acks before a worker that wrote one exits:
            # an epoch only an exited worker saw is known to nobody (docs/handoff.md).
            self.operator_step(self.now)

    def newest_epoch_known_alive(self) -> bool:
        return any(p.view.epoch == self.latest.epoch for p in self.procs.values())

    @rule(watch_fired=st.booleans())
    def table_deleted(self, watch_fired: bool) -> None:
        self.stored = None
        self.react(watch_fired)

    @rule(watch_fired=st.booleans())
    def table_garbled(self, watch_fired: bool) -> None:
        self.stored = GARBLED
        self.react(watch_fired)

    @rule(data=st.data(), watch_fired=st.booleans())
    def table_rolled_back(self, data: st.DataObject, watch_fired: bool) -> None:
        self.stored = data.draw(st.sampled_from(self.history), label="rollback to")
        self.react(watch_fired)

    @rule()
    def backup_taken(self) -> None:
        acks = {n: (p.uid, p.annotation) for n, p in self.pods.items()}
        self.backups.append(Backup(self.stored, dict(self.status), acks))

    @precondition(lambda self: self.backups)
    @rule(data=st.data())
    def cluster_restored(self, data: st.DataObject) -> None:
        """etcd restored from a backup: table, status and acks go back at once. A pod the
        backup does not know (created since, or a later incarnation) has no object any more:
        its kubelet stops it. A pod deleted since comes back without a process."""
        backup = data.draw(st.sampled_from(self.backups), label="restore")
        self.stored = backup.stored
        self.status = dict(backup.status)
        for name in list(self.pods):
            uid, ack = backup.acks.get(name, (None, None))
            if uid != self.pods[name].uid:
                self.delete_pod(name)
            else:
                self.pods[name].annotation = ack
        for name, (uid, ack) in backup.acks.items():
            if name not in self.pods:
                self.pods[name] = Pod(uid=uid, annotation=ack)
        event("cluster restored")
        self.restore_unrepaired = True
        self.restored_at = len(self.history)
        # A process started from now on reads the restored table, and may serve a unit a newer
        # one moved until the repair reaches it: its token is below every token handed out
        # since, so fenced storage refuses it once the newer owner wrote.
        self.fenced_below = max(self.fenced_below, int(backup.status["reservedEpoch"]) + 1)
        self.unaware = set(self.procs)

    @precondition(lambda self: self.unaware & self.procs.keys())
    @rule(data=st.data(), lands_now=st.booleans(), watch_fired=st.booleans())
    def worker_notices_the_restore(
        self, data: st.DataObject, lands_now: bool, watch_fired: bool
    ) -> None:
        name = data.draw(st.sampled_from(sorted(self.unaware & self.procs.keys())))
        self.unaware.discard(name)
        self.write_ack(name, lands_now, rewound=True)
        self.react(watch_fired)

    def react(self, watch_fired: bool) -> None:
        """The operator is level-triggered: a change usually wakes it at once, but may not."""
        if watch_fired:
            self.operator_step(self.now)

    @rule(wanted=st.dictionaries(st.sampled_from(UNITS), names), watch_fired=st.booleans())
    def set_target(self, wanted: dict[str, str], watch_fired: bool) -> None:
        self.target = wanted
        self.react(watch_fired)

    @rule(unit=st.sampled_from(UNITS), name=names, watch_fired=st.booleans())
    def move_unit(self, unit: str, name: str, watch_fired: bool) -> None:
        self.target = {**self.target, unit: name}
        self.react(watch_fired)

    @rule(dt=st.floats(0.5, 2 * TIMEOUT), watch_fired=st.booleans())
    def advance_clock(self, dt: float, watch_fired: bool) -> None:
        self.now += dt
        self.react(watch_fired)

    # ---------------------------------------------------------------------------------- pods

    def start_process(self, name: str) -> None:
        pod = self.pods[name]
        # A starting worker reads the table with a consistent read: never older than what a
        # crashed predecessor in the same pod saw or acknowledged, unless the cluster was
        # restored from a backup since: then what the ConfigMap holds.
        self.procs[name] = Process(Incarnation(name, pod.uid), view=self.history[0])
        self.catch_up(name)

    @rule(name=names)
    def create_pod(self, name: str) -> None:
        if name not in self.pods:
            self.pods[name] = Pod(uid=f"{name}-{next(self.uids)}")
            self.start_process(name)

    @rule(name=names)
    def crash_process(self, name: str) -> None:
        self.procs.pop(name, None)

    @rule(name=names)
    def restart_process(self, name: str) -> None:
        pod = self.pods.get(name)
        if pod is not None and not pod.terminating and name not in self.procs:
            self.start_process(name)

    @rule(name=names, watch_fired=st.booleans())
    def container_restarts(self, name: str, watch_fired: bool) -> None:
        """The process dies (the pod turns NotReady); the kubelet starts it again later."""
        self.crash_process(name)
        self.react(watch_fired)

    @rule(name=names, watch_fired=st.booleans())
    def pod_recreated(self, name: str, watch_fired: bool) -> None:
        """A StatefulSet pod deleted (its process gone) and created again under its name."""
        self.delete_pod(name)
        self.react(watch_fired)
        self.create_pod(name)

    @rule(name=names)
    def terminate_pod(self, name: str) -> None:
        if name in self.pods:
            self.pods[name].terminating = True
            if name in self.procs:
                self.procs[name].draining = True

    @rule(name=names)
    def worker_announces_draining(self, name: str) -> None:
        if name in self.procs:
            self.procs[name].draining = True

    @rule(name=names)
    def delete_pod(self, name: str) -> None:
        # Graceful deletion: the object goes only after its containers are gone.
        self.procs.pop(name, None)
        self.pods.pop(name, None)

    # ------------------------------------------------------------------------------- workers

    def handle(self, name: str, table: AssignmentTable) -> None:
        proc = self.procs[name]
        assert supersedes(table, proc.view) or table is proc.view
        plan = plan_worker(table, proc.me, proc.serving)
        for unit in plan.stop:
            del proc.serving[unit]
            proc.finishing.discard(unit)
        proc.finishing |= plan.release
        proc.finishing -= owned_units(table, proc.me)
        for unit in plan.acquire:
            token = table.units[unit].epoch
            holder = self.token_holders.setdefault((unit, token), proc.me.uid)
            assert holder == proc.me.uid, f"{unit} epoch {token} granted to {holder} and {proc.me}"
            proc.serving[unit] = token
        proc.view = table

    @precondition(lambda self: self.procs)
    @rule(data=st.data())
    def worker_observes(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.procs)))
        seen = self.procs[name].view.epoch
        later = [t for t in self.observable() if t.epoch > seen]
        if later:
            self.handle(name, data.draw(st.sampled_from(later), label="table"))

    @precondition(lambda self: any(p.finishing for p in self.procs.values()))
    @rule(data=st.data())
    def worker_finishes(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, p in self.procs.items() if p.finishing)))
        proc = self.procs[name]
        unit = data.draw(st.sampled_from(sorted(proc.finishing)))
        proc.finishing.discard(unit)
        del proc.serving[unit]

    def write_ack(self, name: str, lands_now: bool, rewound: bool = False) -> None:
        proc = self.procs[name]
        proc.names_set |= rewound
        ack = make_ack(proc.view, proc.me, pending=proc.finishing, draining=proc.draining)
        if proc.names_set:
            ack = replace(ack, set_uid=proc.view.set_ref.uid)
        if lands_now:
            self.pods[name].annotation = ack
        else:
            self.in_flight.append((name, ack))

    @precondition(lambda self: self.procs)
    @rule(data=st.data(), lands_now=st.booleans())
    def worker_acks(self, data: st.DataObject, lands_now: bool) -> None:
        self.write_ack(data.draw(st.sampled_from(sorted(self.procs))), lands_now)

    @precondition(lambda self: self.procs)
    @rule(data=st.data(), finish=st.booleans(), ack=st.booleans())
    def worker_catches_up(self, data: st.DataObject, finish: bool, ack: bool) -> None:
        """The common case, in one step: handle the latest table, maybe finish, maybe ack."""
        name = data.draw(st.sampled_from(sorted(self.procs)))
        proc = self.procs[name]
        self.catch_up(name)
        if finish:
            for unit in proc.finishing:
                del proc.serving[unit]
            proc.finishing.clear()
        if ack:
            self.write_ack(name, lands_now=True)

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), watch_fired=st.booleans())
    def ack_lands(self, data: st.DataObject, watch_fired: bool) -> None:
        # Any in-flight write, in any order; it lands on whichever pod has that name now.
        name, ack = self.in_flight.pop(data.draw(st.integers(0, len(self.in_flight) - 1)))
        if name in self.pods:
            self.pods[name].annotation = ack
        self.react(watch_fired)

    # ---------------------------------------------------------------------------- invariants

    @invariant()
    def epochs_never_go_backwards(self) -> None:
        for old, new in pairwise(self.history):
            assert new.epoch > old.epoch
            assert new.set_ref == old.set_ref
            for unit, state in old.units.items():
                assert new.units[unit].epoch >= state.epoch

    @invariant()
    def no_unit_lost(self) -> None:
        assert set(self.latest.units) == set(UNITS)

    @invariant()
    def workers_serve_only_what_their_view_gives_them(self) -> None:
        # Spelled out from the table, independently of the worker rule under test.
        for proc in self.procs.values():
            me_in_view = proc.view.member_uids.get(proc.me.name) == proc.me.uid
            assert proc.finishing <= proc.serving.keys()
            for unit, token in proc.serving.items():
                state = proc.view.units[unit]
                assert me_in_view
                assert state.owner == proc.me.name
                assert state.epoch == token
                assert state.releasing is None or unit in proc.finishing, (
                    f"{proc.me} takes new work for {unit} while releasing it"
                )

    @invariant()
    def one_believer_per_unit_and_epoch(self) -> None:
        for unit in UNITS:
            epochs = [
                p.view.units[unit].epoch
                for p in self.procs.values()
                if is_owner(p.view, p.me, unit) or unit in releasing_units(p.view, p.me)
            ]
            assert len(epochs) == len(set(epochs)), f"two live pods own {unit} in one epoch"

    @invariant()
    def servers_are_current_owners_unless_forced(self) -> None:
        # Catches a wrong grant when it is published, before the new owner even sees it.
        latest = self.latest
        for proc in self.procs.values():
            for unit, token in proc.serving.items():
                state = latest.units[unit]
                current = (
                    state.owner == proc.me.name
                    and latest.member_uids[proc.me.name] == proc.me.uid
                    and state.epoch == token
                )
                assert current or self.allowed(unit, proc.me.uid, token), (
                    f"{proc.me} still serves {unit} (epoch {token}) but the table gave it to "
                    f"{state.owner} (epoch {state.epoch}) without a timed-out hand-off"
                )

    def allowed(self, unit: str, uid: str, token: int) -> bool:
        """Serving an outdated token is allowed only where a timeout allowed it."""
        return (unit, uid, token) in self.forced or token < self.fenced_below

    @invariant()
    def no_overlap_unless_forced(self) -> None:
        for unit in UNITS:
            servers = sorted(
                (p.serving[unit], p.me.uid) for p in self.procs.values() if unit in p.serving
            )
            tokens = [token for token, _ in servers]
            assert len(tokens) == len(set(tokens)), f"{unit} served twice under one epoch"
            for token, uid in servers[:-1]:
                assert self.allowed(unit, uid, token), (
                    f"{unit} served by {uid} (epoch {token}) and by a newer owner, "
                    "without a timed-out hand-off"
                )

    # ------------------------------------------------------------------------------ liveness

    def quiesce(self) -> None:
        """Faults stop, workers cooperate, the controller targets the healthy pods: within a
        few rounds every unit is owned by its target and served by it alone, no timeout needed."""
        for name in [
            n
            for n, p in self.pods.items()
            if p.terminating or (n in self.procs and self.procs[n].draining)
        ]:
            self.delete_pod(name)
        if not self.pods:
            self.create_pod(NAMES[0])
        for name in self.pods.keys() - self.procs.keys():
            self.start_process(name)
        healthy = sorted(self.pods)
        self.target = {u: healthy[i % len(healthy)] for i, u in enumerate(self.latest.unit_names)}
        for name, ack in self.in_flight:
            if name in self.pods:
                self.pods[name].annotation = ack
        self.in_flight.clear()
        for name in sorted(self.unaware & self.procs.keys()):
            self.write_ack(name, lands_now=True, rewound=True)
        self.unaware.clear()
        decision = None
        for _ in range(6):
            if self.state.fence_until is not None:
                self.now = max(self.now, self.state.fence_until)
            for hold in self.state.restart_holds.values():
                # A pod deleted for good is waited for no longer than the grace.
                self.now = max(self.now, hold.until(RESTART_GRACE))
            for name, proc in self.procs.items():
                self.catch_up(name)
                for unit in list(proc.finishing):
                    del proc.serving[unit]
                proc.finishing.clear()
                self.write_ack(name, lands_now=True)
            decision = self.operator_step(self.now)
            if decision is not None and decision.new_table is None:
                break
        assert decision is not None, "no fixed point"
        assert decision.new_table is None, "no fixed point"
        for name in self.procs:
            self.catch_up(name)
        assert not self.latest.releasing()
        assert self.latest.owners() == self.target
        for proc in self.procs.values():
            assert proc.serving.keys() == owned_units(self.latest, proc.me)

    def teardown(self) -> None:
        if sys.exc_info()[0] is None:  # do not mask the failure being reported
            self.quiesce()
            self.no_overlap_unless_forced()


TestHandoffModel = HandoffModel.TestCase
TestHandoffModel.settings = settings(
    max_examples=int(os.environ.get("APPORTION_MODEL_EXAMPLES", "300")),
    stateful_step_count=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
