"""The Spin model and the Python engine must not drift (issue 33; docs/handoff.md "How we
know"): the model's own runs are replayed through the real code, event by event.

The model (models/handoff/handoff.pml) prints, in simulation only, a line per event (`EV kind
args`) and after each operator pass the table it published (`EV pass ...` then `ST ...` per
unit). The replay feeds the same events to `engine.handoff.step`, `engine.handoff.recover`
through `SetState` (resume, reservation, written, fence, from_status on a restart), exactly as a
controller's pass does, and compares the published table after every pass.

How the model's abstractions map onto the engine's inputs:
  - pod name p (0, 1) is member "p<p>"; incarnation k of it (the model's uid[p]) has uid
    "p<p>-<k>"; the model's members (muid) are the table's member incarnations;
  - unit i is unit "<i>"; owner NONE (2) is no owner; a unit's token `tok` is UnitState.epoch;
    `rel`/`to`/`rep` are `releasing`, its `to` (NONE: to nobody) and its epoch;
  - time is discrete: `tick` advances one clock, the operator's and every worker's, by one
    second; handoffTimeout is TMIN seconds and the tables' servingLease W seconds (`EV lease`,
    none under KEEP), so the model's tick counters (tmo, fenceAge, a worker's age and release
    deadline rdl) are differences of `now`;
  - the status is {"reservedEpoch", "epoch", "fencedUntil"} as SetState writes and reads it;
    an operator crash is a new SetState.from_status(status); the table deleted is no table
    read, rolled back is the table before the last write read back;
  - a terminated pod is WorkerPod(terminating=True); a deleted one leaves the live pods and its
    ack goes with it; a pass writes nothing above the model's bound on epochs (MAXE, raised by
    `EV quiet` in a liveness run).
  - a worker process is a `WorkerState` and a `ServingLease` (created when the model's process
    starts, dropped when it goes down), run as `Worker` runs them: each table the model's worker
    handles (`view`) is received (the lease told of its releases) and its transitions run,
    stops and acquisitions returning at once, a release until the model's `finished`; each
    `confirm` confirms the lease as of now; each `ack` is the ack `ack_due()` computes, written
    only when it says there is one to write, and that ack is what the operator reads.
After each view, confirmation, finished release and tick the replay compares, per unit, the
token each worker holds and whether it may serve the unit (`Served`); each ack the engine's
worker writes must say what the model's says.

Random simulations of the correct model must agree throughout; each mutant's counterexample
must disagree, at a pass where the engine keeps the rule the mutant dropped. Under CI=true a
missing spin fails (conftest turns skips into errors).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from scripts.model_check import MODEL, MUTANTS, Check, defines_of, run

from apportion.api.assignment import (
    Ack,
    AssignmentTable,
    Incarnation,
    Release,
    ResourceRef,
    UnitState,
)
from apportion.api.pods import WorkerPod
from apportion.engine.handoff import owned_units, releasing_units, step
from apportion.engine.set_state import SetState
from apportion.worker import WorkerState
from apportion.worker._lease import ServingLease
from tests.support.present import present

pytestmark = pytest.mark.skipif(
    shutil.which("spin") is None or shutil.which("cc") is None,
    reason="spin or cc missing (apt-get install spin; make native-deps)",
)

SET = ResourceRef("PartitionSet", "default", "demo", "set-uid")
NONE = 2  # the model's NP: no pod
T0 = 1_000_000.0  # the clock at tick 0
Unit = tuple[int, int, int, int, int]
"""Owner, token, releasing, to, release epoch (to and epoch 0 when not releasing)."""
MARKER = re.compile(r"^(EV|ST|WK) (.*)$", re.MULTILINE)
WORKER_EVENTS = ("view", "confirm", "finished", "serving")
"""Events after which the model prints, per unit, what the worker holds and serves."""


def _define(defines: list[str], name: str) -> int:
    values = [d.split("=")[1] for d in defines if d.split("=")[0] == f"-D{name}"]
    if not values:
        raise ValueError(f"{name} is not set in {defines}")
    return int(values[-1])


@dataclass(frozen=True)
class Published:
    """The table after a pass as the model prints it: None when there is no ConfigMap."""

    epoch: int
    members: tuple[int, int]
    units: tuple[Unit, ...]


@dataclass
class Process:
    """A worker process: its state and its serving lease, on the replay's clock."""

    state: WorkerState
    lease: ServingLease

    def settle(self) -> None:
        """Run the transitions due (`Worker._plan_loop`): stops and acquisitions return at
        once, releases stay busy until `finished`."""
        while (transition := self.state.next_transition()) is not None:
            self.state.stopped(transition.stop)
            self.state.acquired(transition.acquire)

    def serves(self, unit: str) -> bool:
        """May serve `unit` now: hold it under the token the newest table gives this
        incarnation, as owner or releasing it, within the lease (a releasing unit's own
        deadline included) — what `Worker.owns` and, for a release being finished,
        `Worker.lease_holds` with the table's owner and token (the Kafka consumer's
        `_serving`) say."""
        view, token = self.state.view, self.state.token(unit)
        if view is None or token is None or view.units[unit].epoch != token:
            return False
        mine = owned_units(view, self.state.me) | releasing_units(view, self.state.me)
        return unit in mine and self.lease.valid(unit)


@dataclass
class Engine:
    """The real code in the place of the model's operator and workers, fed the model's events."""

    count: int
    timeout: float
    max_epoch: int
    now: float = T0
    lease: float | None = None
    """The tables' servingLease (`EV lease`)."""
    pods: dict[str, WorkerPod] = field(default_factory=dict)
    acks: dict[str, Ack] = field(default_factory=dict)
    target: dict[str, str | None] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    state: SetState = field(default_factory=SetState)
    table: AssignmentTable | None = None
    before: AssignmentTable | None = None
    """The table before the last write (a rollback restores it)."""

    workers: dict[str, Process] = field(default_factory=dict)
    """Each pod's running worker process (the model's `up`, from `start` to `down`)."""

    def __post_init__(self) -> None:
        self.pods = {f"p{p}": WorkerPod(f"p{p}", f"p{p}-1") for p in (0, 1)}

    def worker(self, pod: int) -> Worker:
        """Per unit: the token pod `pod`'s process holds (0: none), whether it is finishing a
        release of it (busy: the replay's other callbacks return at once), whether it may
        serve it."""
        process = self.workers.get(f"p{pod}")
        if process is None:
            return Worker((0,) * self.count, (False,) * self.count, (False,) * self.count)
        units = [str(u) for u in range(self.count)]
        return Worker(
            tuple(process.state.held.get(u, 0) for u in units),
            tuple(u in process.state.busy for u in units),
            tuple(process.serves(u) for u in units),
        )

    def ack(self, pod: int) -> Ack | None:
        """The worker writes the ack `ack_due` asks for, if any (`Worker._ack_loop`)."""
        process = self.workers[f"p{pod}"]
        due = process.state.ack_due()
        if due is not None:
            process.state.ack_written(due)
            self.acks[f"p{pod}"] = due
        return due

    def process_event(self, kind: str, pod: int, args: list[int]) -> None:
        """An event of pod `pod`'s worker process."""
        name = f"p{pod}"
        match kind, args:
            case "start", []:
                me = Incarnation(name, self.pods[name].uid)
                state = WorkerState(me, SET.kind, SET.namespace, SET.name)
                self.workers[name] = Process(state, ServingLease(None, clock=lambda: self.now))
            case "view", [_]:  # `Worker._on_table`
                process = self.workers[name]
                table = self.table or self.template()
                if process.state.receive(table):
                    process.lease.duration = table.serving_lease
                    process.lease.releasing(releasing_units(table, process.state.me))
                process.settle()
            case "confirm", []:
                self.workers[name].lease.confirm(self.now)
            case "finished", [unit]:
                self.workers[name].state.released([str(unit)])
                self.workers[name].settle()
            case "serving", []:
                pass  # time passed: only what the worker serves may have changed
            case "down", []:
                self.workers.pop(name, None)  # a pod deleted may have had none running
            case _:
                raise ValueError(f"unknown event {kind} {pod} {args}")

    def template(self) -> AssignmentTable:
        table = AssignmentTable.initial(SET, generation=1, key_scheme="netherite", count=self.count)
        return replace(table, serving_lease=self.lease)

    def event(self, kind: str, args: list[int]) -> None:
        match kind, args:
            case "lease", [seconds]:
                self.lease = float(seconds) if seconds else None
            case "tick", []:
                self.now += 1
            case "target", [unit, pod]:
                self.target[str(unit)] = None if pod == NONE else f"p{pod}"
            case "term", [pod]:
                self.pods[f"p{pod}"] = replace(self.pods[f"p{pod}"], terminating=True)
            case "gone", [pod]:
                del self.pods[f"p{pod}"]
                self.acks.pop(f"p{pod}", None)
            case "pod", [pod, uid]:
                self.pods[f"p{pod}"] = WorkerPod(f"p{pod}", f"p{pod}-{uid}")
            case "report", [epoch]:
                self.status["epoch"] = epoch
            case "crash", []:
                self.state = SetState.from_status(self.status)
            case "delete", []:
                self.table = None
            case "rollback", []:
                self.table = self.before
            case "quiet", [epochs]:
                self.max_epoch = epochs
            case _:
                raise ValueError(f"unknown event {kind} {args}")

    def operator_pass(self) -> None:
        """One pass, as the controller runs it: resume (repair first), the fence, one step."""
        table, repair = self.state.resume(
            self.table, None, self.status, self.template(), self.now, self.timeout
        )
        if repair is not None:
            self._write(repair.table)
            return
        if self.state.fence(self.now) is not None:
            return
        decision = step(
            table,
            self.target,
            self.acks,
            self.pods,
            self.now,
            self.timeout,
            releases_known=self.state.known_releases(),
        )
        new = decision.new_table
        if new is not None and new.epoch <= self.max_epoch:
            self._write(new)

    def _write(self, table: AssignmentTable) -> None:
        self.status.update(self.state.reservation(table) or {})
        self.before, self.table = self.table, table
        self.state.written(table, self.now)

    def published(self) -> Published | None:
        if self.table is None:
            return None
        uids = self.table.member_uids
        members = tuple(int(uids[f"p{p}"].split("-")[1]) if f"p{p}" in uids else 0 for p in (0, 1))
        units = tuple(_unit(self.table.units[str(u)]) for u in range(self.count))
        return Published(self.table.epoch, (members[0], members[1]), units)


def _unit(state: UnitState) -> Unit:
    owner = NONE if state.owner is None else int(state.owner[1:])
    release = state.releasing
    if release is None:
        return owner, state.epoch, 0, 0, 0
    to = NONE if release.to is None else int(release.to[1:])
    return owner, state.epoch, 1, to, release.epoch


@dataclass(frozen=True)
class Worker:
    """A worker process, per unit: the token it holds (0: none), whether it is finishing a
    release of it, whether it may serve it."""

    held: tuple[int, ...]
    finishing: tuple[bool, ...]
    serves: tuple[bool, ...]


@dataclass(frozen=True)
class Seen:
    """After a worker event (`kind`) of pod `pod`: the model's worker and the engine's."""

    kind: str
    pod: int
    model: Worker
    engine: Worker

    def held_differs(self) -> list[int]:
        """Units held under different tokens, except those the engine is finishing a release
        of: it does that to the end before it stops or acquires the unit again, where the
        model's worker drops it at once, or goes on serving it when the release is
        cancelled."""
        return [
            u
            for u in range(len(self.model.held))
            if not self.engine.finishing[u] and self.model.held[u] != self.engine.held[u]
        ]

    def serving_differs(self) -> list[int]:
        """Units that both hold under the same token, both finishing a release or neither,
        and only one of them may serve."""
        model, engine = self.model, self.engine
        return [
            u
            for u in range(len(model.held))
            if model.held[u] == engine.held[u]
            and model.finishing[u] == engine.finishing[u]
            and model.serves[u] != engine.serves[u]
        ]


@dataclass(frozen=True)
class Acked:
    """The model's worker wrote an ack: (uid, epoch, pending units as bits); the one the
    engine's worker wrote then, None if `ack_due` had nothing to say."""

    pod: int
    model: tuple[int, int, int]
    engine: tuple[int, int, int] | None


@dataclass(frozen=True)
class Pass:
    """One operator pass of a model run: the model's table and the engine's, after it."""

    model: Published | None
    engine: Published | None
    engine_before: Published | None


def _ack_tuple(ack: Ack) -> tuple[int, int, int]:
    return int(ack.uid.split("-")[1]), ack.epoch, sum(1 << int(u) for u in ack.pending)


def replay(output: str, defines: list[str]) -> Iterator[Pass | Seen | Acked]:
    """The model's run (its printed markers) fed to the engine, event by event."""
    count = _define(defines, "NU")
    engine = Engine(count, float(_define(defines, "TMIN")), _define(defines, "MAXE"))
    lines = [(m.group(1), m.group(2).split()) for m in MARKER.finditer(output)]
    for index, (tag, words) in enumerate(lines):
        if tag != "EV":
            continue
        kind, args = words[0], [int(w) for w in words[1:]]
        following = [
            [int(w) for w in words]
            for tag, words in lines[index + 1 : index + 1 + count]
            if tag != "EV"
        ]  # the unit lines after a worker event or a pass
        if kind == "ack":
            pod, uid, epoch, pending = args
            written = engine.ack(pod)
            engine_ack = None if written is None else _ack_tuple(written)
            yield Acked(pod, (uid, epoch, pending), engine_ack)
            continue
        if kind in (*WORKER_EVENTS, "start", "down"):
            engine.process_event(kind, args[0], args[1:])
            if kind in WORKER_EVENTS:
                yield Seen(kind, args[0], _printed_worker(following), engine.worker(args[0]))
            continue
        if kind != "pass":
            engine.event(kind, args)
            continue
        before = engine.published()
        engine.operator_pass()
        yield Pass(_printed_table(args, following), engine.published(), before)


def _printed_worker(lines: list[list[int]]) -> Worker:
    """`WK unit held finishing serves` per unit."""
    return Worker(
        tuple(held for _, held, _, _ in lines),
        tuple(finishing == 1 for _, _, finishing, _ in lines),
        tuple(serves == 1 for _, _, _, serves in lines),
    )


def _printed_table(args: list[int], lines: list[list[int]]) -> Published | None:
    """`EV pass ok epoch members...`, then `ST unit own tok rel to rep` per unit."""
    ok, epoch, m0, m1 = args
    units = tuple(
        (own, tok, rel, to if rel else 0, rep if rel else 0) for _, own, tok, rel, to, rep in lines
    )
    # epoch 0: the template, before any write; the engine publishes no table for it
    return Published(epoch, (m0, m1), units) if ok and epoch > 0 else None


def _passes(output: str, defines: list[str]) -> list[Pass]:
    return [one for one in replay(output, defines) if isinstance(one, Pass)]


def _spin(args: list[str], cwd: Path) -> str:
    done = subprocess.run(
        ["nice", "-n", "10", "spin", "-T", *args], cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# --- random runs of the correct model ------------------------------------------------------

_ALL = ("-DNU=2", "-DCRASHES=2", "-DATTACKS=2", "-DRESTARTS", "-DPODS", "-DMAXINC=2", "-DFAULTS=4")
SIMULATIONS = (
    [("hand-offs", ("-DNU=2",), seed) for seed in (1, 2, 3)]
    + [("pods", ("-DNU=1", "-DPODS", "-DMAXINC=3", "-DFAULTS=3"), seed) for seed in (2, 8, 17)]
    + [("crash+table", ("-DNU=1", "-DCRASHES=2", "-DATTACKS=2"), seed) for seed in (6, 7, 8)]
    + [("all faults", _ALL, seed) for seed in (2, 3, 8)]
)
"""Seeds whose runs have each kind of thing to compare (a fault budget lets the pods' runs go
on with live pods after their faults)."""


@pytest.mark.parametrize(
    ("name", "extra", "seed"), SIMULATIONS, ids=[f"{n}-{s}" for n, _, s in SIMULATIONS]
)
def test_engine_agrees_with_the_model_at_every_step(
    name: str, extra: tuple[str, ...], seed: int, tmp_path: Path
) -> None:
    defines = defines_of(Check(name, ("-DMAXE=40", "-DTMIN=2", *extra)))
    output = _spin([*defines, "-u20000", f"-n{seed}", str(MODEL)], tmp_path)
    steps = list(replay(output, defines))
    for number, one in enumerate(steps):
        if isinstance(one, Pass):
            assert one.engine == one.model, f"step {number}: the operator drifted: {one}"
        elif isinstance(one, Seen):
            assert not one.held_differs(), f"step {number}: the worker holds otherwise: {one}"
            assert not one.serving_differs(), f"step {number}: the worker serves otherwise: {one}"
        else:
            assert one.engine in (None, one.model), f"step {number}: another ack: {one}"
    # the run had something to compare of each kind
    written = {p.model for p in steps if isinstance(p, Pass) and p.model is not None}
    assert len(written) >= 2, f"the run wrote too few tables to compare:\n{output}"
    seen = [one for one in steps if isinstance(one, Seen)]
    assert any(one.kind == "view" for one in seen), f"no worker handled a table:\n{output}"
    assert any(any(one.engine.serves) for one in seen), f"no worker served:\n{output}"
    assert any(isinstance(one, Acked) and one.engine for one in steps), f"no ack:\n{output}"
    finishing = [
        one
        for one in seen
        if any(m and e for m, e in zip(one.model.finishing, one.engine.finishing, strict=True))
    ]
    assert finishing, f"no release's own deadline compared:\n{output}"


# --- the mutants' counterexamples ----------------------------------------------------------


def _tables(one: Pass) -> tuple[Published, Published, Published]:
    """Before the pass (the engine's), after it in the model, after it in the engine."""
    return (
        present(one.engine_before, "no table before the pass"),
        present(one.model, "the model has no table"),
        present(one.engine, "the engine has no table"),
    )


def _units(one: Pass) -> list[tuple[Unit, Unit, Unit]]:
    before, model, engine = _tables(one)
    return list(zip(before.units, model.units, engine.units, strict=True))


def _granted(one: Pass, *, by_model: bool) -> bool:
    """One side moved a releasing unit on (the model: `by_model`); the other still has its
    owner releasing it."""
    for before, model, engine in _units(one):
        moved, waiting = (model, engine) if by_model else (engine, model)
        if before[2] == 1 and moved[0] != before[0] and waiting[0] == before[0] and waiting[2]:
            return True
    return False


def _new_token(one: Pass) -> bool:
    """Both moved the unit; the mutant kept its token, the engine's is the write's epoch."""
    epoch = _tables(one)[2].epoch
    return any(
        m[0] == e[0] != b[0] and m[1] == b[1] and e[1] == epoch > b[1] for b, m, e in _units(one)
    )


def _releases_to_nobody(one: Pass) -> bool:
    """The mutant unowned a leaving owner's unit at once; the engine releases it to nobody."""
    return any(
        b[2] == 0 and m[0] == NONE and e[0] == b[0] and e[2:4] == (1, NONE)
        for b, m, e in _units(one)
    )


def _above_reservation(one: Pass) -> bool:
    """The mutant's repair reused an epoch; the engine's is above every one reserved."""
    model = present(one.model, "the model has no table")
    return present(one.engine, "the engine has no table").epoch > model.epoch


def _fenced(one: Pass, *, by_model: bool) -> bool:
    """One side (the model: `by_model`) kept the fence, the table before with every unit
    unowned; the other placed a unit."""
    before, model, engine = _tables(one)
    kept, placed = (model, engine) if by_model else (engine, model)
    unowned = all(unit[0] == NONE for unit in before.units)
    return kept == before and unowned and any(unit[0] != NONE for unit in placed.units)


KEPT: dict[str, Callable[[Pass], bool]] = {
    "M_NO_ACK_WAIT": lambda one: _granted(one, by_model=True),
    "M_ACK_EPOCH_IGNORED": lambda one: _granted(one, by_model=True),
    "M_TOKEN_KEPT": _new_token,
    "M_NOBODY_WITHOUT_RELEASE": _releases_to_nobody,
    "M_REPAIR_IGNORES_RESERVATION": _above_reservation,
    "M_FENCE_NOT_WAITED": lambda one: _fenced(one, by_model=False),
    "M_NO_TIMEOUT": lambda one: _granted(one, by_model=False),
    "M_FENCE_KEPT": lambda one: _fenced(one, by_model=True),
}
"""Per mutant: the engine keeps the rule it dropped, at the first pass where the two differ:
it waits for the ack (the first two), gives the new owner the write's epoch as token,
releases a leaving owner's unit to nobody, repairs above the reservation, keeps the fence;
along a liveness mutant's cycle it times the release out, lifts the fence.
M_LEASE_OUTLIVES_TIMEOUT is the worker's lease, not the operator's: its trail replays with no
difference at all (below)."""

REPLAYED = [c for c in MUTANTS if c.name in KEPT]


@pytest.mark.parametrize("check", REPLAYED, ids=[c.name for c in REPLAYED])
def test_engine_keeps_the_rule_each_mutant_dropped(check: Check, tmp_path: Path) -> None:
    model = tmp_path / "handoff.pml"
    model.write_text(MODEL.read_text())
    outcome = run(check, tmp_path, model)
    assert outcome.errors >= 1, outcome.output
    defines = defines_of(check)
    passes = _passes(_spin([*defines, "-t", model.name], tmp_path), defines)
    differ = [one for one in passes if one.model != one.engine]
    assert differ, f"{check.rule}: the engine follows the mutant's counterexample all the way"
    assert KEPT[check.name](differ[0]), f"{check.rule}: {differ[0]}"


def test_lease_mutant_is_no_operator_change(tmp_path: Path) -> None:
    """The operator's decisions along the lease mutant's trail are the engine's: what breaks
    StopServing there is the worker serving past handoffTimeout, the lease's inequality."""
    (check,) = [c for c in MUTANTS if c.name == "M_LEASE_OUTLIVES_TIMEOUT"]
    model = tmp_path / "handoff.pml"
    model.write_text(MODEL.read_text())
    assert run(check, tmp_path, model).errors >= 1
    defines = defines_of(check)
    passes = _passes(_spin([*defines, "-t", model.name], tmp_path), defines)
    assert passes, "the trail has operator passes"
    assert all(one.model == one.engine for one in passes)


def test_release_mapping_is_the_model_encoding() -> None:
    """The mapping itself: a release to nobody and an unowned unit, as the model prints them."""
    assert _unit(UnitState("p1", 3, Release(None, T0, 4))) == (1, 3, 1, NONE, 4)
    assert _unit(UnitState(None, 5)) == (NONE, 5, 0, 0, 0)
