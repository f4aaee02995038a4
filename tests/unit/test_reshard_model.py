"""Model-based test of online resharding, on top of the hand-off model (test_handoff_model).

Everything the hand-off model does (operator steps with a skewed clock or none at all, pods
created, terminated, deleted and recreated, worker processes that crash, restart, see stale
tables in order and write acks that land late) goes on, and the spec's unit count changes at
any time among 1, 2, 4 and 8 (keyScheme apportion). The operator follows the resharding rule
of the pass (settle, gather, then one table with the new count); workers apply
`apportion.engine.reshard.reshape` before the worker rule.

Keys are the 8 hash ranges of the finest count: key `i` lies in unit `i·c/8` of count `c`.
Besides the hand-off model's invariants (written per key here, since unit names change meaning
with the count), the model tracks where each key's in-memory state is: a process holds a key's
state after loading it (acquire, or a merge loading a sibling) and keeps it while carrying it
into children. After every step: each key has at most one live server under the current token,
and every process serves only keys whose state it holds, unless it lost the key to a timeout.
"""

from __future__ import annotations

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from apportion.api.assignment import AssignmentTable
from apportion.api.pods import WorkerPod
from apportion.engine.handoff import (
    HandoffDecision,
    Reason,
    is_owner,
    make_ack,
    plan_worker,
    releasing_units,
    step,
    supersedes,
)
from apportion.engine.reshard import gather_targets, next_lineage, progress, reshape, resharded
from tests.unit import test_handoff_model
from tests.unit.test_handoff_model import SET, TIMEOUT, HandoffModel, Process

FINE = 8
KEYS = range(FINE)


def keys_of(unit: str, count: int) -> list[int]:
    return [i for i in KEYS if i * count // FINE == int(unit)]


def unit_of(key: int, count: int) -> str:
    return str(key * count // FINE)


class ReshardModel(HandoffModel):
    def __init__(self) -> None:
        super().__init__()
        self.history = [AssignmentTable.initial(SET, generation=1, key_scheme="apportion", count=2)]
        self.wanted = 2
        # key → uid of the process whose memory holds its state (absent: only the store has it)
        self.holder: dict[int, str] = {}
        # (key, uid, token): that incarnation lost the key's unit (token) to handoffTimeout
        self.forced_keys: set[tuple[int, str, int]] = set()

    # ------------------------------------------------------------------------------ operator

    def operator_step(self, now: float) -> HandoffDecision:
        published = self.latest
        live = {n: WorkerPod(n, p.uid, terminating=p.terminating) for n, p in self.pods.items()}
        acks = {n: p.annotation for n, p in self.pods.items() if p.annotation is not None}
        target: dict[str, str | None] = {
            u: p for u, p in self.target.items() if u in published.units
        }
        lineage = next_lineage(published, self.wanted)
        if lineage is not None:
            # As the pass: no optional move while the count changes; a unit whose owner is
            # gone still goes to its target; a merge gathers each group of siblings.
            held: dict[str, str | None] = {}
            for unit, state in published.units.items():
                alive = state.owner in live and live[state.owner].uid == (
                    published.member_uids.get(state.owner)
                )
                if state.releasing is not None:
                    held[unit] = state.releasing.to
                elif alive:
                    held[unit] = state.owner
                else:
                    held[unit] = target.get(unit)
            target = gather_targets(lineage, held) if not lineage.split else held
        decision = step(published, target, acks, live, now, TIMEOUT)
        if decision.new_table is None and lineage is not None and progress(published, lineage).done:
            table = resharded(published, lineage, published.generation)
            event(f"resharded {'split' if lineage.split else 'merge'}")
            decision = HandoffDecision(table, (), (), None)
        new = decision.new_table
        if new is None:
            return decision
        assert new.epoch == published.epoch + 1
        for happened in decision.events:
            event(happened.reason.value)
            if happened.reason is Reason.HANDOFF_TIMED_OUT:
                for unit in happened.units:
                    old = published.units[unit]
                    assert old.owner is not None
                    uid = published.member_uids[old.owner]
                    for key in keys_of(unit, published.count):
                        self.forced_keys.add((key, uid, old.epoch))
        self.history.append(new)
        return decision

    @rule(count=st.sampled_from([1, 2, 4, 8]), watch_fired=st.booleans())
    def change_count(self, count: int, watch_fired: bool) -> None:
        self.wanted = count
        self.react(watch_fired)

    # ------------------------------------------------------------------------------- workers

    def handle(self, name: str, table: AssignmentTable) -> None:
        proc = self.procs[name]
        assert supersedes(table, proc.view) or table is proc.view
        uid = proc.me.uid
        plan = reshape(table, proc.me, proc.view.count, proc.serving)
        if plan is not None:
            old_count = proc.view.count
            for child, parents in plan.carried.items():
                for key in keys_of(child, table.count):
                    if unit_of(key, old_count) in parents:
                        assert self.holder.get(key) == uid, (
                            f"{proc.me} carries key {key} into {child} but its state is held "
                            f"by {self.holder.get(key)}"
                        )
                owner = self.token_holders.setdefault((child, table.units[child].epoch), uid)
                assert owner == uid
            for missing in plan.load.values():
                for parent in missing:
                    for key in keys_of(parent, old_count):
                        self.holder[key] = uid
            proc.serving = dict(plan.serving)
            proc.finishing = set()
            event("worker carried state" if plan.carried else "worker dropped state")
        work = plan_worker(table, proc.me, proc.serving)
        for unit in work.stop:
            del proc.serving[unit]
            proc.finishing.discard(unit)
        proc.finishing |= work.release
        proc.finishing -= {u for u in table.units if is_owner(table, proc.me, u)}
        for unit in work.acquire:
            token = table.units[unit].epoch
            holder = self.token_holders.setdefault((unit, token), uid)
            assert holder == uid, f"{unit} epoch {token} granted to {holder} and {proc.me}"
            proc.serving[unit] = token
            for key in keys_of(unit, table.count):
                self.holder[key] = uid  # loaded from the store
        proc.view = table

    # ---------------------------------------------------------------------------- invariants

    def served_keys(self) -> list[tuple[int, str, int, Process]]:
        """(key, uid, token, process) for every key a live process serves, in its own count."""
        return [
            (key, proc.me.uid, token, proc)
            for proc in self.procs.values()
            for unit, token in proc.serving.items()
            for key in keys_of(unit, proc.view.count)
        ]

    def lost_to_timeout(self, key: int, uid: str, token: int) -> bool:
        return any(k == key and u == uid and t >= token for k, u, t in self.forced_keys)

    def epochs_never_go_backwards(self) -> None:
        for old, new in zip(self.history, self.history[1:], strict=False):
            assert new.epoch == old.epoch + 1
            assert new.set_ref == old.set_ref
            for unit in old.units.keys() & new.units.keys():
                assert new.units[unit].epoch >= old.units[unit].epoch

    def no_unit_lost(self) -> None:
        assert set(self.latest.units) == {str(u) for u in range(self.latest.count)}

    def one_believer_per_unit_and_epoch(self) -> None:
        beliefs = [
            (unit, p.view.units[unit].epoch)
            for p in self.procs.values()
            for unit in p.view.units
            if is_owner(p.view, p.me, unit) or unit in releasing_units(p.view, p.me)
        ]
        assert len(beliefs) == len(set(beliefs)), "two live pods own one unit in one epoch"

    def servers_are_current_owners_unless_forced(self) -> None:
        latest = self.latest
        for key, uid, token, proc in self.served_keys():
            state = latest.units[unit_of(key, latest.count)]
            # A process that has not seen the latest tables may serve a key under an older
            # token (and count) as long as the key stayed its own; whether its state is still
            # the key's state is what state_is_where_it_is_served checks.
            mine = state.owner == proc.me.name and latest.member_uids[proc.me.name] == uid
            current = mine and state.epoch >= token
            assert current or self.lost_to_timeout(key, uid, token), (
                f"{proc.me} serves key {key} (token {token}, count {proc.view.count}) but the "
                f"table gives it to {state.owner} (token {state.epoch}, count {latest.count})"
            )

    def no_overlap_unless_forced(self) -> None:
        for key in KEYS:
            servers = sorted((t, u) for k, u, t, _ in self.served_keys() if k == key)
            assert len({u for _, u in servers}) == len(servers), f"key {key} served twice"
            for token, uid in servers[:-1]:
                assert self.lost_to_timeout(key, uid, token), (
                    f"key {key} served by {uid} (token {token}) and by a newer owner"
                )

    def state_is_where_it_is_served(self) -> None:
        for key, uid, token, proc in self.served_keys():
            assert self.holder.get(key) == uid or self.lost_to_timeout(key, uid, token), (
                f"{proc.me} serves key {key} but its state is on {self.holder.get(key)}"
            )

    def check_all(self) -> None:
        self.epochs_never_go_backwards()
        self.no_unit_lost()
        self.one_believer_per_unit_and_epoch()
        self.servers_are_current_owners_unless_forced()
        self.no_overlap_unless_forced()
        self.state_is_where_it_is_served()

    # Not named `invariants`: RuleBasedStateMachine keeps its list of invariants under that name.
    @invariant()
    def invariants_hold(self) -> None:
        self.check_all()

    # ------------------------------------------------------------------------------ liveness

    def quiesce(self) -> None:
        """Faults stop, workers cooperate: the resharding completes (every key on the pod
        that serves it all along), then the hand-off model's liveness holds."""
        for name in [
            n
            for n, p in self.pods.items()
            if p.terminating or (n in self.procs and self.procs[n].draining)
        ]:
            self.delete_pod(name)
        for name, ack in self.in_flight:
            if name in self.pods:
                self.pods[name].annotation = ack
        self.in_flight.clear()
        if not self.pods:
            self.create_pod("p0")
        for _ in range(8):
            if self.latest.count == self.wanted:
                break
            # As the pass's strategy would: every unit targets a live pod (a unit whose
            # target is gone would never gather with its siblings).
            healthy = sorted(self.pods)
            self.target = {
                u: healthy[i % len(healthy)] for i, u in enumerate(self.latest.unit_names)
            }
            for name in self.pods.keys() - self.procs.keys():
                self.start_process(name)
            for name, proc in self.procs.items():
                self.handle(name, self.latest)
                for unit in list(proc.finishing):
                    del proc.serving[unit]
                proc.finishing.clear()
                self.pods[name].annotation = make_ack(proc.view, proc.me, draining=proc.draining)
            self.operator_step(self.now)
            self.check_all()
        assert self.latest.count == self.wanted, "resharding did not complete"
        super().quiesce()
        self.check_all()


TestReshardModel = ReshardModel.TestCase
TestReshardModel.settings = (
    test_handoff_model.TestHandoffModel.settings
)  # same depth, APPORTION_MODEL_EXAMPLES
