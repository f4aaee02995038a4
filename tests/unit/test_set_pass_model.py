"""Model-based test of the whole placement pass (`apportion.engine.set_pass.plan_pass`), not only
its parts (test_handoff_model.py drives `handoff.step`, `SetState` and the restart holds alone).

The model is the API server and the workers: pods come and go (a new incarnation of a name gets
a new uid), turn Ready and NotReady, are deleted gracefully (terminating); a worker acknowledges
the latest table it may have seen, some releases still pending; the spec's partition count
changes (split and merge, keyScheme apportion) and so does the strategy; time passes. The
operator's pass is `plan_pass` with the inputs the set loop gives it, the table it returns is
published as written. After each pass the guarantees of docs/handoff.md are checked with the
model's own bookkeeping — never with the engine's helpers:

- every write bumps the table epoch by one, and a unit's token never goes down; every change of
  owner gets the write's epoch as its new token (guarantees 1 and 3);
- a unit leaves its owner A only when A's incarnation is gone, or A acknowledged the release
  (an ack of A's uid, release epoch ≤ ack epoch ≤ the table's epoch, the unit not pending), or
  the release was published `handoffTimeout` ago (guarantee 2);
- a unit is handed only to a selected pod that is not terminating, the incarnation the table
  records, and Ready unless no pod is (the strategies' last resort); a release's target is
  such a member when the release starts, and the release ends with it as long as it is live
  and not terminating, Ready or not (docs/handoff.md, "The operator's step"); a merge gathers
  siblings on the member most of them are with, Ready or not (docs/resharding.md);
- a count change keeps each unit with its parent's (split) or its children's (merge) owner;
- once the model stops interfering (every worker acks, time passes a round at a time), every
  unit is owned by a live member that is not terminating, and no release is left (guarantee
  5); with Balanced, by a Ready one (LeastShards and ConsistentHashing leave a not-ready
  member its units, as Akka does).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from apportion.api import PartitionSet
from apportion.api.assignment import Ack, AssignmentTable, ResourceRef, UnitState
from apportion.api.pods import WorkerPod
from apportion.engine.set_pass import PassInput, PassResult, initial_table, plan_pass

NAMES = ("w-0", "w-1", "w-2", "w-3")
COUNTS = (4, 8)
INTERVAL = 1.0
TIMEOUT = 5.0
REF = ResourceRef("PartitionSet", "ns", "model", "set-uid")
ACK = REF.ack_annotation
STRATEGIES = ("Balanced", "LeastShards", "ConsistentHashing")

names = st.sampled_from(NAMES)


def spec_of(partitions: int, strategy: str) -> Any:
    body = {
        "partitions": partitions,
        "keyScheme": "apportion",
        "selector": {"matchLabels": {"app": "w"}},
        "strategy": {"name": strategy},
        "rebalance": {"interval": f"{INTERVAL:.0f}s", "handoffTimeout": f"{TIMEOUT:.0f}s"},
    }
    return PartitionSet.model_validate({"metadata": {"name": "model"}, "spec": body}).spec


@dataclass
class Pod:
    uid: str
    ready: bool = False
    terminating: bool = False
    ack: Ack | None = None

    def view(self, name: str) -> WorkerPod:
        acks = {} if self.ack is None else {ACK: self.ack.to_annotation()}
        return WorkerPod(
            name, self.uid, {"app": "w"}, ready=self.ready, terminating=self.terminating, acks=acks
        )


class PassModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pods: dict[str, Pod] = {}
        self.uids = itertools.count()
        self.now = 1000.0
        self.partitions = COUNTS[0]
        self.strategy = STRATEGIES[0]
        self.table: AssignmentTable = initial_table(REF, self.spec, 1)
        self.last_round: float | None = None
        # (unit, release epoch) → when the model published that release: the operator's
        # `releases_known`, kept apart from the table's `since`.
        self.known: dict[tuple[str, int], float] = {}

    @property
    def spec(self) -> Any:
        return spec_of(self.partitions, self.strategy)

    @initialize(strategy=st.sampled_from(STRATEGIES), ready=st.integers(1, 3))
    def start(self, strategy: str, ready: int) -> None:
        self.strategy = strategy
        for name in NAMES[:ready]:
            self.pods[name] = Pod(self.new_uid(), ready=True)

    def new_uid(self) -> str:
        return f"uid-{next(self.uids)}"

    # -------------------------------------------------------------------------- the cluster

    @rule(name=names)
    def create(self, name: str) -> None:
        """A pod of this name is created (a new incarnation when it was there): not Ready yet."""
        self.pods[name] = Pod(self.new_uid())

    @rule(name=names, ready=st.booleans())
    def readiness(self, name: str, ready: bool) -> None:
        if name in self.pods and not self.pods[name].terminating:
            self.pods[name].ready = ready

    @rule(name=names)
    def terminate(self, name: str) -> None:
        if name in self.pods:
            self.pods[name].terminating = True

    @rule(name=names)
    def delete(self, name: str) -> None:
        self.pods.pop(name, None)

    @rule(name=names, data=st.data())
    def acknowledge(self, name: str, data: st.DataObject) -> None:
        """The worker acks the published table, perhaps with some of its releases still
        finishing (pending)."""
        pod = self.pods.get(name)
        if pod is None:
            return
        mine = sorted(
            u for u, s in self.table.units.items() if s.owner == name and s.releasing is not None
        )
        pending = data.draw(st.sets(st.sampled_from(mine)) if mine else st.just(set()))
        pod.ack = Ack(uid=pod.uid, epoch=self.table.epoch, pending=frozenset(pending))

    @rule()
    def everyone_acknowledges(self) -> None:
        for pod in self.pods.values():
            pod.ack = Ack(uid=pod.uid, epoch=self.table.epoch)

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0, 6.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule(partitions=st.sampled_from(COUNTS))
    def resize(self, partitions: int) -> None:
        self.partitions = partitions

    @rule(strategy=st.sampled_from(STRATEGIES))
    def change_strategy(self, strategy: str) -> None:
        self.strategy = strategy

    # ------------------------------------------------------------------------- the operator

    def plan(self) -> PassResult:
        releases = {
            unit: self.known[(unit, s.releasing.epoch)]
            for unit, s in self.table.units.items()
            if s.releasing is not None and (unit, s.releasing.epoch) in self.known
        }
        return plan_pass(
            PassInput(
                spec=self.spec,
                published=self.table,
                generation=1,
                pods=[pod.view(name) for name, pod in sorted(self.pods.items())],
                now=self.now,
                last_round=self.last_round,
                releases_known=releases,
            )
        )

    @rule()
    def operator_pass(self) -> None:
        result = self.plan()
        new = result.new_table
        if new is None:
            event("pass: nothing to write")
            return
        self.check(self.table, new)
        if result.round_started:
            self.last_round = self.now
        self.publish(new)

    def publish(self, new: AssignmentTable) -> None:
        for unit, state in new.units.items():
            if state.releasing is not None:
                self.known.setdefault((unit, state.releasing.epoch), self.now)
        self.table = new

    @precondition(lambda self: any(p.ready and not p.terminating for p in self.pods.values()))
    @rule()
    def settle(self) -> None:
        """Faults stop: every worker acks what it sees, time goes a round per pass; placement
        ends with every unit on a Ready member and nothing in hand-off."""
        for _ in range(60):
            for pod in self.pods.values():
                pod.ack = Ack(uid=pod.uid, epoch=self.table.epoch)
            result = self.plan()
            if result.new_table is None:
                break
            self.check(self.table, result.new_table)
            if result.round_started:
                self.last_round = self.now
            self.publish(result.new_table)
            self.now += INTERVAL
        else:
            raise AssertionError("no fixed point after 60 passes")
        table = self.table
        assert table.count == self.partitions, "the count change ends"
        for unit, state in table.units.items():
            assert state.releasing is None, f"unit {unit} still in hand-off"
            owner = self.pods.get(state.owner or "")
            assert owner is not None, f"unit {unit} has no live owner after settling: {state.owner}"
            assert owner.uid == table.member_uids.get(state.owner or ""), (
                f"unit {unit} has no live owner after settling: {state.owner}"
            )
            assert not owner.terminating, f"unit {unit} stays on terminating {state.owner}"
            # Balanced moves the units of a not-ready member; LeastShards and
            # ConsistentHashing leave them with it, as Akka does with an unreachable member.
            if self.strategy == "Balanced":
                assert owner.ready, f"unit {unit} stays on not-ready {state.owner}"
        event("settled")

    # ---------------------------------------------------------------------------- the oracle

    def member(self, name: str | None, table: AssignmentTable) -> bool:
        """A destination: a selected pod, not terminating, the incarnation `table` records for
        it, and Ready — unless no pod is both (the strategies' last resort, docs/strategies.md:
        units never go to a not-ready member while an eligible one exists)."""
        pod = self.pods.get(name or "")
        if pod is None or pod.terminating or table.member_uids.get(name or "") != pod.uid:
            return False
        if not pod.ready:
            event("destination: not Ready, none eligible")
        return pod.ready or not any(p.ready and not p.terminating for p in self.pods.values())

    def check_destination(
        self, unit: str, before: UnitState, owner: str, new: AssignmentTable
    ) -> None:
        """A release ends with its target (docs/handoff.md: a destination live and not
        draining; it may have turned NotReady since the release started); any other new owner
        is the strategy's choice of this pass."""
        release = before.releasing
        if release is not None and release.to == owner:
            pod = self.pods.get(owner)
            assert pod is not None, f"unit {unit} handed to {owner}"
            assert not pod.terminating, f"unit {unit} handed to {owner}"
            assert new.member_uids.get(owner) == pod.uid, f"unit {unit} to a new {owner}"
            if not pod.ready:
                event("handed: release target turned NotReady meanwhile")
            return
        assert self.member(owner, new), f"unit {unit} handed to {owner}"

    def alive(self, name: str, table: AssignmentTable) -> bool:
        pod = self.pods.get(name)
        return pod is not None and pod.uid == table.member_uids.get(name)

    def check(self, old: AssignmentTable, new: AssignmentTable) -> None:
        assert new.epoch == old.epoch + 1, f"epoch {old.epoch} → {new.epoch}"
        if new.count != old.count:
            self.check_reshard(old, new)
            return
        moved = 0
        for unit, after in new.units.items():
            before = old.units[unit]
            assert after.epoch >= before.epoch, f"unit {unit}'s token went down"
            if after.owner != before.owner:
                assert after.epoch == new.epoch, f"unit {unit} changed hands under an old token"
                if before.owner is not None:
                    self.check_released(unit, old)
                if after.owner is not None:
                    self.check_destination(unit, before, after.owner, new)
                    moved += 1
            release = after.releasing
            if release is not None and release != before.releasing:
                assert after.owner == before.owner, "a release starts from the owner"
                if self.partitions < old.count:
                    # Gathering for a merge: to the member most siblings are with, Ready or
                    # not (docs/resharding.md, "Gathering").
                    to = release.to
                    assert to is None or (self.alive(to, new) and not self.pods[to].terminating)
                    event("released: gathering for a merge")
                else:
                    assert release.to is None or self.member(release.to, new), (
                        f"unit {unit} released to {release.to}, not a Ready member"
                    )
        if moved:
            event("published: units changed hands")
        if any(s.releasing for s in new.units.values()):
            event("published: a release in flight")

    def check_released(self, unit: str, old: AssignmentTable) -> None:
        """The owner in `old` may lose `unit` only as docs/handoff.md guarantee 2 says."""
        before = old.units[unit]
        owner = str(before.owner)
        if not self.alive(owner, old):
            event("handed: owner gone")
            return
        release = before.releasing
        assert release is not None, f"unit {unit} taken from live {owner} without a release"
        ack = self.pods[owner].ack
        if (
            ack is not None
            and ack.uid == old.member_uids[owner]
            and release.epoch <= ack.epoch <= old.epoch
            and unit not in ack.pending
        ):
            event("handed: owner acked")
            return
        known = self.known.get((unit, release.epoch))
        assert known is not None, f"unit {unit} taken from {owner} before its ack or the timeout"
        assert self.now - known >= TIMEOUT, (
            f"unit {unit} taken from {owner} before its ack or the timeout"
        )
        event("handed: handoff timed out")

    def check_reshard(self, old: AssignmentTable, new: AssignmentTable) -> None:
        """A count change moves no unit: the new units stay with their parent (split) or their
        children, gathered on one member first (merge)."""
        event(f"resharded {old.count} → {new.count}")
        assert not any(s.releasing for s in old.units.values()), "resharded mid hand-off"
        if new.count > old.count:
            factor = new.count // old.count
            for unit, state in new.units.items():
                parent = old.units[str(int(unit) // factor)]
                assert state.owner == parent.owner, f"split unit {unit} left its parent's owner"
        else:
            factor = old.count // new.count
            for unit, state in new.units.items():
                children = {old.units[str(int(unit) * factor + k)].owner for k in range(factor)}
                assert children == {state.owner}, f"merged unit {unit} was not gathered"


PassModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("SET_PASS_MODEL_EXAMPLES", "150")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPassModel = PassModel.TestCase
