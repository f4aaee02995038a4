"""Model of the serving lease against the operator's timeout (docs/handoff.md, "Cut off or
paused"): real time, clocks that run at different rates and start anywhere, confirmations that
are lost (a partition) or answered late, a worker paused for any time, the operator's write
answered late and a failover to a standby with another clock. It drives the code that runs:
`ServingLease` on the worker's side and `engine.handoff.step` (with `releases_known`, as the
operator's loop passes it) on the operator's. Property: with the inequality of the docs,
L(1+rho) + S <= T(1-rho), the worker A has stopped serving unit 0 (S after its lease ran out) before
the operator may give it to B."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from apportion.api.assignment import AssignmentTable, Incarnation, Release, ResourceRef, UnitState
from apportion.api.pods import WorkerPod
from apportion.engine.handoff import Reason, step
from apportion.worker._lease import ServingLease

RHO = 0.01
T = 60.0
A, B = Incarnation("a", "ua"), Incarnation("b", "ub")
REF = ResourceRef("ShardSet", "ns", "s", "uid")


@dataclass(frozen=True)
class Clock:
    """A clock reading `offset + rate · t` at real time t."""

    offset: float
    rate: float

    def at(self, t: float) -> float:
        return self.offset + self.rate * t

    def when(self, reading: float) -> float:
        """The real time at which this clock reads `reading`."""
        return (reading - self.offset) / self.rate


clocks = st.builds(Clock, st.floats(-1e6, 1e6), st.floats(1 - RHO, 1 + RHO, allow_subnormal=False))


@dataclass(frozen=True)
class Confirmation:
    sent: float  # when the GET left the worker, real time relative to the release's commit
    read_after: float  # until the API server read the table
    answered_after: float | None  # until the answer arrived; None: lost


confirmations = st.builds(
    Confirmation,
    st.floats(-T, T),
    st.floats(0, 10),
    st.one_of(st.none(), st.floats(0, 10)),
)


@dataclass(frozen=True)
class OperatorSide:
    """How the operator learns that the release committed: the writer stamps `since` on its
    clock and learns of the commit when its write is answered; or a standby with its own clock
    first reads the table at a failover."""

    writer_clock: Clock
    standby_clock: Clock
    stamped_before: float  # `since` stamped this long before the commit
    write_answered_after: float
    failover_after: float | None


operator_sides = st.builds(
    OperatorSide,
    clocks,
    clocks,
    st.floats(0, 5),
    st.floats(0, 10),
    st.one_of(st.none(), st.floats(0, 200)),
)


def released(since: float, epoch: int = 2) -> AssignmentTable:
    units = {"0": UnitState(A.name, 1, Release(B.name, since, epoch))}
    return AssignmentTable(REF, 1, "akka", 1, epoch, (A, B), units)


def reassigned_at(table: AssignmentTable, clock: Clock, known: float, start: float) -> float:
    """The first real time from `start` at which `step`, run by an operator on `clock` that
    knew the release at its reading `known`, gives unit 0 to B (bisection: `step` is monotone
    in its `now`)."""
    live = {A.name: WorkerPod(A.name, A.uid), B.name: WorkerPod(B.name, B.uid)}

    def moved(t: float) -> bool:
        decision = step(table, {"0": B.name}, {}, live, clock.at(t), T, releases_known={"0": known})
        return any(e.reason is Reason.HANDOFF_TIMED_OUT for e in decision.events)

    since = table.units["0"].releasing.since  # type: ignore[union-attr]
    low, high = start, clock.when(max(since, known) + T) + 1.0  # a skew only ever delays it
    assert not moved(low)
    assert moved(high)
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (low, middle) if moved(middle) else (middle, high)
    return high


@settings(max_examples=400, deadline=None)
@given(
    lease_share=st.floats(0.05, 0.5),
    worker_clock=clocks,
    published=st.floats(0, 200),  # P: the release's table committed
    operator=operator_sides,
    sends=st.lists(confirmations, max_size=40),
    paused=st.one_of(st.none(), st.tuples(st.floats(0, 300), st.floats(0, 300))),
)
def test_the_worker_stops_before_the_operator_may_reassign(
    lease_share: float,
    worker_clock: Clock,
    published: float,
    operator: OperatorSide,
    sends: list[Confirmation],
    paused: tuple[float, float] | None,
) -> None:
    writer_clock, standby_clock = operator.writer_clock, operator.standby_clock
    stamped_before, failover_after = operator.stamped_before, operator.failover_after
    write_answered_after = operator.write_answered_after
    lease_seconds = lease_share * T
    stop_time = T * (1 - RHO) - lease_seconds * (1 + RHO)  # S: the most the inequality allows
    assume(stop_time >= 0)

    # The operator (OperatorSide).
    table = released(writer_clock.at(published - stamped_before))
    if failover_after is None:
        known_at = published + write_answered_after
        reassign = reassigned_at(table, writer_clock, writer_clock.at(known_at), known_at)
    else:
        known_at = published + failover_after
        reassign = reassigned_at(table, standby_clock, standby_clock.at(known_at), known_at)
        event("failover to a standby")

    # The worker: answers are handled in the order they arrive, none while it is paused (they
    # wait for it), each answer's table being the one the API server held when it read.
    lease = ServingLease(lease_seconds, clock=lambda: 0.0)
    arrivals = []
    for c in sends:
        if c.answered_after is None:
            continue
        arrive = published + c.sent + c.read_after + c.answered_after
        if paused is not None and paused[0] <= arrive < paused[0] + paused[1]:
            arrive = paused[0] + paused[1]
        arrivals.append((arrive, c))
    last_serving = -float("inf")
    saw_release = False
    for arrive, c in sorted(arrivals, key=lambda x: x[0]):
        if arrive >= reassign:
            break  # from here on the tables give unit 0 to B: A stops on sight of them
        if c.sent + c.read_after >= 0 and not saw_release:
            lease.releasing({"0"})  # the table that releases unit 0, handled before confirming
            saw_release = True
        lease.confirm(worker_clock.at(published + c.sent))
        deadline = lease.expires_at("0")
        assert deadline is not None
        last_serving = max(last_serving, worker_clock.when(deadline))
    event("saw the release" if saw_release else "cut off before the release")
    event("served past the release" if last_serving > published else "stopped before it")
    # Serving (and S of in-flight work after it) ends before B may start.
    assert last_serving + stop_time <= reassign + 1e-6


def test_the_model_fails_without_the_send_time() -> None:
    """The model catches a lease timed from the answer instead of the request: a confirmation
    read just before the release but answered late would let the worker serve too long."""
    lease_seconds = T / 3
    lease = ServingLease(lease_seconds, clock=lambda: 0.0)
    clock = Clock(0.0, 1.0)
    published, answered = 100.0, 100.0 + T  # read at 99.9, answered a hand-off timeout later
    lease.confirm(clock.at(answered))  # wrong: the answer's arrival
    reassign = reassigned_at(released(published), clock, clock.at(published), published)
    deadline = lease.expires_at("0")
    assert deadline is not None
    assert clock.when(deadline) > reassign
