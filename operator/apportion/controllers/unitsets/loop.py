"""The placement loop of PartitionSets and ShardSets: one per set, level-triggered.

The loop sleeps until something it reads changes (a pod or workload it selects, the set
itself: see `wakeups`), a hand-off times out or a held rebalance round is due. Each pass declares
what it selects to the caches (`caches`), reads the cached pods and workloads (and scrapes the
workers' load), hands them to the engine (`apportion.engine.set_loop`: whether anything is new,
the pass, when to look again) and writes what it decided: at most one ConfigMap write per new
table, then Events, the status and the pods' deletion costs. The loop decides nothing itself.
All state lives in the API server: on start (operator restart, standby taking over) the loop
decodes the published table and continues from its epoch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, cast

from pydantic import ValidationError

from apportion.api.assignment import AssignmentTable, ResourceRef, assignment_config_map
from apportion.api.common import seconds
from apportion.api.conditions import (
    condition_time,
    dump_conditions,
)
from apportion.api.pods import WorkerPod
from apportion.api.resource import Resource
from apportion.api.unitset import MetricsSource, UnitSetSpec
from apportion.controllers import telemetry
from apportion.controllers.caches import Want
from apportion.controllers.pods import pods_of, select
from apportion.controllers.runtime import Runtime
from apportion.controllers.wakeups import loop_key
from apportion.controllers.workloads import find_workload, rollout_of
from apportion.engine.handoff import Reason
from apportion.engine.kstatus import blocked_conditions
from apportion.engine.restarts import RestartHold
from apportion.engine.set_loop import Gathered, next_wake, prepare, run, written
from apportion.engine.set_pass import (
    PassResult,
    Problem,
    Rollout,
    acked_epoch,
    initial_table,
)
from apportion.engine.set_state import SetState, loads_grace, timestamp
from apportion.engine.set_status import StatusInput, suspension_news, suspensions, unit_set_status
from apportion.publishing.configmaps import (
    AssignmentStore,
)
from apportion.publishing.status import patch_status

_ACTIONS = {Reason.ASSIGNED: "Assign", Reason.RESHARDED: "Reshard"}
_HANDOFF_OUTCOMES = {
    Reason.HANDOFF_COMPLETED: "completed",
    Reason.HANDOFF_CANCELLED: "cancelled",
    Reason.HANDOFF_TIMED_OUT: "timed_out",
}


# ------------------------------------------------------------------------------------ the loop


class SetLoop:
    """The loop of one set; `body` follows the object's changes as the watch delivers them."""

    def __init__(
        self,
        kind: type[Resource],
        body: Mapping[str, Any],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        runtime: Runtime,
    ) -> None:
        meta = body["metadata"]
        self.runtime = runtime
        self.kind = kind
        self.last_body = body
        self.logger = logger
        self.namespace: str = meta["namespace"]
        self.key = loop_key(kind.__name__, self.namespace, meta["name"])
        self.set_ref = ResourceRef(kind.__name__, self.namespace, meta["name"], meta["uid"])
        self.config_map = assignment_config_map(kind.__name__, meta["name"])
        self.store = AssignmentStore(runtime.client, self.set_ref, self.config_map)
        runtime.tables.roots[(self.namespace, self.config_map)] = self.key
        self.labels = (kind.__name__, self.namespace, meta["name"])
        self.outcome = "unchanged"
        self.published: AssignmentTable | None = None
        self.exists = False  # whether the ConfigMap holds our table
        self.state = SetState.from_status(body.get("status") or {})
        self.status: dict[str, Any] | None = None
        self.reported: set[str] = set()
        self.awaiting_loads: str | None = None
        self.suspensions_seen: dict[str, int] | None = None  # pod uid → suspensions reported
        self.desired_members: int | None = None
        self.created = seconds(meta.get("creationTimestamp"))  # the start of startup.timeout
        self.fingerprint: tuple[Hashable, ...] | None = None
        self.wake_at: float | None = None
        self._parsed: tuple[int, Resource | ValidationError] | None = None

    @property
    def body(self) -> Mapping[str, Any]:
        """The set as the watch last delivered it."""
        self.last_body = self.runtime.body(self.key) or self.last_body
        return self.last_body

    @property
    def holder_key(self) -> str:
        """The set among its namespace's sets (`Kind/name`), as the pods' deletion costs count
        its holdings; `key` is its loop's key."""
        return f"{self.set_ref.kind}/{self.set_ref.name}"

    async def write_status(self, status: Mapping[str, Any]) -> None:
        await patch_status(
            self.runtime.client, self.set_ref.kind, self.namespace, self.set_ref.name, status
        )

    def forget(self) -> None:
        self.published = None
        self.fingerprint = None

    async def failed(self, error: BaseException, retry_in: float) -> None:
        self.fingerprint = None
        await self.report_failure(f"{error or type(error).__name__}", retry_in)

    def finish(self, deleted: bool) -> None:
        if deleted:
            self.release_pods()
        self.runtime.tables.roots.pop((self.namespace, self.config_map), None)

    async def load(self, spec: UnitSetSpec, acked: int = 0) -> None:
        """Continue from the published table, or repair it first when it is gone, unreadable,
        rolled back or tampered with, or older than an epoch a worker `acked`
        (`SetState.resume`)."""
        loaded = await self.store.load()
        table, repair = self.state.resume(
            loaded.table,
            loaded.unreadable,
            self.body.get("status") or {},
            template=initial_table(self.set_ref, spec, self.generation),
            now=time.time(),  # the read came back: its releases are known from now on
            handoff_timeout=spec.rebalance.handoff_timeout.total_seconds(),
            acked=acked,
        )
        self.fingerprint = None
        if repair is None:
            self.published = table
            self.exists = loaded.table is not None
            self.record_table()
            self.logger.debug("Continuing from epoch %d", table.epoch)
            return
        self.logger.warning("Repairing the assignment: %s", repair.message)
        self.runtime.events.post(
            self.set_ref, "Warning", repair.damage.value, "Repair", repair.message
        )
        await self.write_table(table)

    async def write_table(self, table: AssignmentTable) -> None:
        """Reserve the table's epoch in the status, then write the table: the status then
        always names an epoch at or above every table ever written, and a fence its end."""
        reservation = self.state.reservation(table)
        if reservation is not None:
            await self.write_status(reservation)
            self.state.holds_reported()
        await self.store.publish(table)
        self.published, self.exists = table, True
        self.state.written(table, time.time())
        self.record_table()

    def record_table(self) -> None:
        assert self.published is not None
        telemetry.TABLE_EPOCH.labels(*self.labels).set(self.published.epoch)
        telemetry.TABLE_SIZE.labels(*self.labels).set(self.store.size)

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation") or 0)

    def parse(self) -> Resource | ValidationError:
        """The typed object for the current generation (parsed once per generation)."""
        if self._parsed is None or self._parsed[0] != self.generation:
            try:
                value: Resource | ValidationError = self.kind.from_raw(self.body)
            except ValidationError as error:
                value = error
            self._parsed = (self.generation, value)
        return self._parsed[1]

    async def reconcile(self) -> float | None:
        """One pass; returns when the next one is due although nothing changes."""
        now = time.time()
        parsed = self.parse()
        if isinstance(parsed, ValidationError):
            await self.report_invalid(f"spec rejected by the operator: {parsed.errors()[0]['msg']}")
            return None
        spec = cast(UnitSetSpec, parsed.spec)
        if self.runtime.tables.changed(self.key, self.store.version):
            self.published = None  # someone else wrote or deleted it: read it back
        if self.published is None:
            await self.load(spec)
        assert self.published is not None

        await self.watch(spec)
        visible = pods_of(self.runtime.pods.selected(self.namespace, self.key))
        acked = acked_epoch(visible, self.set_ref)
        if self.state.went_back(acked, self.published):
            await self.load(spec, acked)
            return now  # pass again from the repair
        members, rollout, problem = self.members(spec, visible)
        loads, source, metrics_problem = await self.loads(spec, members, now)
        gathered = Gathered(
            spec=spec,
            published=self.published,
            generation=self.generation,
            members=members,
            visible=visible,
            now=now,
            rollout=rollout,
            problem=problem,
            loads=loads,
            metrics_problem=metrics_problem,
            desired_members=self.desired_members,
            created=self.created,
        )
        prepared = prepare(gathered, self.state, self.fingerprint, self.wake_at)
        if not prepared.new:
            return self.wake_at

        planning = telemetry.timed(telemetry.PLAN_DURATION, self.labels)
        with planning if prepared.problem is None else contextlib.nullcontext():
            outcome = run(gathered, prepared, self.state)
        result = outcome.result
        self.announce_holds(outcome.new_holds, result.restart_grace)
        if outcome.planned:
            self.count_moves(result)
        views = prepared.views
        self.logger.debug(
            "Pass at epoch %d: %d member(s), %d move(s) kept, %d held (%s), next at %s",
            self.published.epoch,
            len(views),
            len(result.kept),
            result.held,
            result.hold_reason,
            result.wake_at,
        )
        if result.new_table is not None:
            await self.publish(result, now)
            return now  # pass again at once: the new table is an input too
        extra = [metrics_problem] if metrics_problem else []
        await self.report(result, views, now, source, extra, loads)
        self.update_costs(visible)
        self.fingerprint = prepared.fingerprint
        self.wake_at = next_wake(gathered, prepared, result, self.state)
        return self.wake_at

    async def loads(
        self, spec: UnitSetSpec, members: Sequence[WorkerPod], now: float
    ) -> tuple[Mapping[str, float] | None, MetricsSource, Problem | None]:
        """Per-unit load the workers report, when the spec says where to scrape it."""
        self.awaiting_loads = None
        if spec.metrics.scrape is None or not members:
            self.state.no_loads_wanted()
            return None, MetricsSource.COUNTS, None
        report = await self.runtime.loads.unit_loads(
            self.namespace, self.set_ref.name, members, spec.metrics
        )
        grace = loads_grace(spec.metrics.scrape)
        loads, fault = self.state.loads(report.unit_loads, now, grace)
        if loads is None and not fault:
            since = self.state.loads_missing_since or now
            self.awaiting_loads = (
                f"counting units until the members report their load (at most {grace:.0f}s, "
                f"{max(0.0, since + grace - now):.0f}s left)"
            )
            return None, MetricsSource.COUNTS, None  # counting units meanwhile is no fault
        if loads is None:
            return None, report.source, Problem("MetricsUnavailable", report.message)
        return loads, report.source, None

    async def watch(self, spec: UnitSetSpec) -> None:
        """Tell the caches what this set reads: its workload, the pods its selectors select and
        the owners of its published units (selected or not: they hand their units off)."""
        assert self.published is not None
        selectors = [spec.selector] if spec.selector is not None else []
        ref = spec.workload_ref
        if ref is not None:
            wanted = Want(self.namespace, names=frozenset({ref.name}))
            await self.runtime.workloads[ref.kind].want(self.key, wanted)
            workload = find_workload(self.runtime.workloads, self.namespace, ref.kind, ref.name)
            selector = workload.label_selector() if workload is not None else None
            # Without the workload's selector nothing is selected (see `members`).
            selectors = [*selectors, selector] if selector is not None else []
        owners = frozenset(name for name, units in self.published.by_member().items() if units)
        await self.runtime.pods.want(self.key, Want(self.namespace, tuple(selectors), owners))

    def members(
        self, spec: UnitSetSpec, visible: Sequence[WorkerPod]
    ) -> tuple[list[WorkerPod], Rollout, Problem | None]:
        """The selected pods, the rollout and, when members cannot be known, why."""
        if spec.workload_ref is None:
            members = select(visible, spec.selector)
            return members, rollout_of(None, members), None
        ref = spec.workload_ref
        workload = find_workload(self.runtime.workloads, self.namespace, ref.kind, ref.name)
        selector = workload.label_selector() if workload is not None else None
        if workload is None or selector is None:
            what = "does not exist" if workload is None else "has no usable selector"
            problem = Problem(
                "WorkloadNotFound",
                f"{ref.kind.value} {ref.name} {what}; the last published assignment is kept",
            )
            return [], Rollout(), problem
        members = select(visible, spec.selector, selector)
        self.desired_members = workload.replicas
        return members, rollout_of(workload, members), None

    def count_moves(self, result: PassResult) -> None:
        if result.plan is not None:
            telemetry.MOVES_PLANNED.labels(*self.labels).inc(len(result.plan.moves))
        telemetry.MOVES_KEPT.labels(*self.labels).inc(len(result.kept))
        telemetry.MOVES_HELD.labels(*self.labels).inc(result.held)

    async def publish(self, result: PassResult, now: float) -> None:
        table = result.new_table
        assert table is not None
        assert result.decision is not None
        assert self.published is not None
        releases = self.published.releasing()
        await self.write_table(table)
        self.outcome = "published"
        for decision in result.decision.events:
            outcome = _HANDOFF_OUTCOMES.get(decision.reason)
            if decision.reason is Reason.HANDOFF_STARTED:
                telemetry.HANDOFFS_STARTED.labels(*self.labels).inc(len(decision.units))
            elif outcome is not None:
                telemetry.HANDOFFS_ENDED.labels(*self.labels, outcome).inc(len(decision.units))
                duration = telemetry.HANDOFF_DURATION.labels(*self.labels, outcome)
                for unit in decision.units:
                    if unit in releases:
                        duration.observe(max(0.0, now - releases[unit].since))
        written(self.state, result, now, self.kind_spec_timeout())
        events = self.runtime.events
        if result.summary:
            events.post(self.set_ref, "Normal", "Rebalancing", "Rebalance", result.summary)
        for decision in result.decision.events:
            action = _ACTIONS.get(decision.reason, "Handoff")
            events.post(
                self.set_ref, decision.type, decision.reason.value, action, decision.message()
            )
        self.logger.info(
            "Published epoch %d: %s",
            table.epoch,
            "; ".join(e.message(sample=4) for e in result.decision.events) or "membership",
        )

    def announce_holds(self, holds: Sequence[tuple[str, RestartHold]], grace: float) -> None:
        """An Event for each member whose units start to wait for its restart, so that
        `kubectl describe` tells why they do not move (or stay unowned)."""
        for name, hold in holds:
            until = timestamp(hold.until(grace))
            message = (
                f"{name} is restarting in place: its {len(hold.units)} unit(s) wait for it "
                f"until {until} (rebalance.restartGrace) instead of moving to another pod"
            )
            self.runtime.events.post(self.set_ref, "Normal", "HeldForRestart", "Place", message)

    async def report_invalid(self, message: str) -> None:
        """A spec the API server accepted but the models reject (CRD/operator version skew):
        nothing is placed, the published table stands."""
        await self.report_blocked("InvalidSpec", message)

    async def report_failure(self, error: str, delay: float) -> None:
        """A pass failed (API unreachable, a write refused, a table that cannot be read or
        written): the status must not go on claiming Ready, and the reason belongs in a condition
        and an Event, not only in the log."""
        message = f"placement pass failed: {error}; retrying in {delay:.0f}s"
        try:
            await self.report_blocked("PassFailed", message)
        except Exception as failure:  # the API server may be what failed
            self.logger.warning("Could not report the failure in the status: %s", failure)

    async def report_blocked(self, reason: str, message: str) -> None:
        previous = (self.status or self.body.get("status") or {}).get("conditions") or ()
        now = condition_time(time.time())
        conditions = blocked_conditions(
            previous, reason, message, generation=self.generation, now=now
        )
        status = {"observedGeneration": self.generation, "conditions": dump_conditions(conditions)}
        if reason not in self.reported:
            self.runtime.events.post(self.set_ref, "Warning", reason, "Place", message)
            self.reported = {reason}
        if status != self.status:
            await self.write_status(status)
            self.status = status

    def kind_spec_interval(self) -> float:
        spec = getattr(self.parse(), "spec", None)
        return spec.rebalance.interval.total_seconds() if spec is not None else 0.0

    def kind_spec_timeout(self) -> float:
        parsed = self.parse()
        spec = getattr(parsed, "spec", None)
        return spec.rebalance.handoff_timeout.total_seconds() if spec is not None else 0.0

    async def report(
        self,
        result: PassResult,
        pods: Sequence[WorkerPod],
        now: float,
        source: MetricsSource,
        extra: Sequence[Problem] = (),
        loads: Mapping[str, float] | None = None,
    ) -> None:
        """Status (when it changed) and a Warning Event for each problem as it appears."""
        assert self.published is not None
        timed_out = self.state.timeout_problem(now)
        problems = [*extra, *([timed_out] if timed_out else [])]
        previous = (self.status or self.body.get("status") or {}).get("conditions") or ()
        status = unit_set_status(
            StatusInput(
                table=self.published,
                result=result,
                pods=pods,
                generation=self.generation,
                config_map=self.config_map if self.exists else None,
                now=now,
                conditions=previous,
                last_round=self.state.last_round,
                metrics_source=source,
                loads=loads,
                extra_problems=problems,
                awaiting_loads=self.awaiting_loads,
            )
        )
        current = {p.reason: p for p in [*result.problems, *problems]}
        for reason in current.keys() - self.reported:
            if reason != "HandoffTimedOut":  # its hand-off Event already said it
                self.runtime.events.post(
                    self.set_ref, "Warning", reason, "Place", current[reason].message
                )
        self.reported = set(current)
        self.report_suspensions(pods)
        if status != self.status:
            await self.write_status(status)
            self.status = status
        self.state.holds_reported()
        self.record_status(status, result, pods, loads)

    def report_suspensions(self, pods: Sequence[WorkerPod]) -> None:
        """An Event for each serving-lease outage a member's ack tells of, once. A new operator
        process takes what the status already counted as reported, or else reports them all."""
        told = suspensions(pods, self.set_ref.ack_annotation)
        counts = {uid: suspended.count for uid, (_, suspended) in told.items()}
        if self.suspensions_seen is None:
            counted = (self.body.get("status") or {}).get("servingSuspensions")
            self.suspensions_seen = counts if counted == sum(counts.values()) else {}
        seen = self.suspensions_seen
        for message in suspension_news(told, seen):
            self.runtime.events.post(self.set_ref, "Warning", "ServingSuspended", "Serve", message)
        new = sum(max(0, count - seen.get(uid, 0)) for uid, count in counts.items())
        if new:
            telemetry.SERVING_SUSPENSIONS.labels(*self.labels).inc(new)
        self.suspensions_seen = counts

    def record_status(
        self,
        status: Mapping[str, Any],
        result: PassResult,
        pods: Sequence[WorkerPod],
        loads: Mapping[str, float] | None,
    ) -> None:
        """The gauges a pass's status holds, and the per-member figures it sums up."""
        assert self.published is not None
        labels = self.labels
        telemetry.UNITS.labels(*labels).set(self.published.count)
        telemetry.UNITS_UNOWNED.labels(*labels).set(
            self.published.count - int(status["assignedUnits"])
        )
        telemetry.RELEASES_FAILING.labels(*labels).set(status["releasesFailing"])
        if result.imbalance is not None:
            telemetry.IMBALANCE.labels(*labels).set(result.imbalance)
        telemetry.REBALANCE_INTERVAL.labels(*labels).set(self.kind_spec_interval())
        for condition in status["conditions"]:
            key = (*labels, condition["type"])
            telemetry.CONDITION.labels(*key).set(condition["status"] == "True")
            since = seconds(condition.get("lastTransitionTime"))
            if since is not None:
                telemetry.CONDITION_SINCE.labels(*key).set(since)
        live = {pod.name: pod.uid for pod in pods}
        uids = self.published.member_uids
        held = {
            member: units
            for member, units in self.published.by_member().items()
            if member in live and live[member] == uids.get(member)
        }
        telemetry.record_members(
            labels,
            {member: len(units) for member, units in held.items()},
            None
            if loads is None
            else {m: math.fsum(loads.get(u, 0.0) for u in units) for m, units in held.items()},
        )

    def update_costs(self, visible: Sequence[WorkerPod]) -> None:
        assert self.published is not None
        uids = self.published.member_uids
        holdings = {
            uids[member]: len(units) for member, units in self.published.by_member().items()
        }
        pods = {pod.uid: (pod.name, pod.deletion_cost) for pod in visible}
        self.runtime.costs.update(self.namespace, self.holder_key, holdings, pods)

    def release_pods(self) -> None:
        """The set is gone: its units no longer count in its pods' deletion costs."""
        self.runtime.costs.forget_set(self.namespace, self.holder_key)
        self.runtime.loads.forget(self.namespace, self.set_ref.name)
