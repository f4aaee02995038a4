"""The placement loop of PartitionSets and ShardSets: one kopf daemon per set, level-triggered.

The daemon sleeps until something it reads changes (a pod or workload it selects, the set
itself: see `wakeups`), a hand-off times out or a held rebalance round is due. Each pass declares
what it selects to the caches (`caches`), reads the cached pods and workloads, runs
`apportion.engine.set_pass.plan_pass` and publishes what it decided: at most one ConfigMap
write per new table, then Events, the status and the pods' deletion costs. All state lives in
the API server: on start (operator restart, standby taking over) the daemon decodes the
published table and continues from its epoch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from apportion.api.assignment import AssignmentTable, ResourceRef
from apportion.api.common import ScrapeSpec
from apportion.api.conditions import (
    ConditionType,
    condition_time,
    dump_conditions,
    set_condition,
)
from apportion.api.pods import WorkerPod
from apportion.api.resource import Resource
from apportion.api.unitset import MetricsSource, UnitSetSpec, assignment_config_map
from apportion.controllers import telemetry
from apportion.controllers.caches import Want
from apportion.controllers.pods import pods_of, select
from apportion.controllers.runtime import Runtime
from apportion.controllers.wakeups import set_key
from apportion.controllers.workloads import find_workload, rollout_of
from apportion.engine.handoff import Reason, recover
from apportion.engine.set_pass import (
    PassInput,
    PassResult,
    Problem,
    Rollout,
    StatusInput,
    initial_table,
    plan_pass,
    suspension_news,
    suspensions,
    unit_set_status,
)
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

TIMEOUT_REPORT_SECONDS = 60.0
"""Degraded stays HandoffTimedOut at least this long (or one handoffTimeout) after a forced
reassignment, so that `kubectl get` shows it."""


# ------------------------------------------------------------------------------------ the loop


class SetLoop:
    """The daemon of one set. `body` is kopf's live body: it follows the object's changes."""

    def __init__(
        self,
        kind: type[Resource],
        body: kopf.Body,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        runtime: Runtime,
    ) -> None:
        meta = body["metadata"]
        self.runtime = runtime
        self.kind = kind
        self.body = body
        self.logger = logger
        self.namespace: str = meta["namespace"]
        self.key = set_key(kind.__name__, self.namespace, meta["name"])
        self.set_ref = ResourceRef(kind.__name__, self.namespace, meta["name"], meta["uid"])
        self.config_map = assignment_config_map(kind.__name__, meta["name"])
        self.store = AssignmentStore(runtime.client, self.set_ref, self.config_map)
        runtime.tables.roots[(self.namespace, self.config_map)] = self.key
        self.labels = (kind.__name__, self.namespace, meta["name"])
        self.outcome = "unchanged"
        self.published: AssignmentTable | None = None
        self.exists = False  # whether the ConfigMap holds our table
        # The last table written or read intact: what the workers serve, should the ConfigMap
        # be lost, garbled or rolled back (docs/handoff.md, "When the table is lost").
        self.remembered: AssignmentTable | None = None
        self.fence_until: float | None = None
        self.fence_problem: Problem | None = None
        status = body.get("status") or {}
        self.reserved_in_status = int(status.get("reservedEpoch") or 0)
        # A fence outlives the operator that raised it: a successor holds it just as long.
        self.fence_until = _seconds(status.get("fencedUntil"))
        if self.fence_until is not None:
            self.fence_problem = Problem(
                "AssignmentFenced", "every unit stays unowned until the fence has held"
            )
        self.last_round = _seconds(status.get("lastRebalanceTime"))
        self.status: dict[str, Any] | None = None
        self.reported: set[str] = set()
        self.suspensions_seen: dict[str, int] | None = None  # pod uid → suspensions reported
        self.timed_out = _timed_out_from(status)
        # (unit, release epoch) → when this replica knew the release was published: a release
        # is timed from then, never from a `since` another replica's clock wrote (the serving
        # lease's inequality, docs/handoff.md).
        self.releases_known: dict[tuple[str, int], float] = {}
        self.known_loads: dict[str, float] = {}
        self.loads_missing_since: float | None = None
        self.desired_members: int | None = None
        self.fingerprint: tuple[Any, ...] | None = None
        self.wake_at: float | None = None
        self._parsed: tuple[int, Resource | ValidationError] | None = None

    @property
    def set_key(self) -> str:
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

    async def load(self, spec: UnitSetSpec, now: float) -> None:
        """Continue from the published table, or repair it first when it is gone, unreadable,
        rolled back or tampered with (`engine.handoff.recover`)."""
        loaded = await self.store.load()
        status = self.body.get("status") or {}
        reserved = self.reserved_in_status = max(
            self.reserved_in_status, int(status.get("reservedEpoch") or 0)
        )
        if not reserved:
            # A status from before epochs were reserved: the table and the status's epoch are
            # all that tell how far epochs went.
            found = loaded.table.epoch if loaded.table is not None else 0
            reserved = max(int(status.get("epoch") or 0), found)
        template = initial_table(self.set_ref, spec, self.generation)
        repair = recover(
            loaded.table,
            loaded.unreadable,
            published=int(status.get("epoch") or 0),
            reserved=reserved,
            remembered=self.remembered,
            template=template,
        )
        self.fingerprint = None
        if repair is None:
            self.published = loaded.table or template
            self.exists = loaded.table is not None
            self.remember(self.published)
            self.record_table()
            self.note_releases(self.published, time.time())
            self.logger.debug("Continuing from epoch %d", self.published.epoch)
            return
        self.logger.warning("Repairing the assignment: %s", repair.message)
        self.runtime.events.post(
            self.set_ref, "Warning", repair.damage.value, "Repair", repair.message
        )
        if repair.fenced:
            self.fence_until = now + spec.rebalance.handoff_timeout.total_seconds()
            self.fence_problem = Problem("AssignmentFenced", repair.message)
        await self.write_table(repair.table)

    def remember(self, table: AssignmentTable) -> None:
        self.remembered = table

    async def write_table(self, table: AssignmentTable) -> None:
        """Reserve the table's epoch in the status, then write the table: the status then
        always names an epoch at or above every table ever written, and a fence its end."""
        if table.epoch > self.reserved_in_status or self.fence_until is not None:
            fence = None if self.fence_until is None else _timestamp(self.fence_until)
            await self.write_status(
                {"reservedEpoch": max(table.epoch, self.reserved_in_status), "fencedUntil": fence},
            )
            self.reserved_in_status = max(table.epoch, self.reserved_in_status)
        await self.store.publish(table)
        self.published, self.exists = table, True
        self.remember(table)
        self.record_table()
        self.note_releases(table, time.time())

    def note_releases(self, table: AssignmentTable, known_at: float) -> None:
        """The releases of `table`, committed by `known_at` (a write returned, a read came back)."""
        releasing = {(unit, r.epoch) for unit, r in table.releasing().items()}
        self.releases_known = {k: v for k, v in self.releases_known.items() if k in releasing}
        for key in releasing:
            self.releases_known.setdefault(key, known_at)

    def known_releases(self) -> dict[str, float]:
        """unit → when its release was known; note_releases keeps the map to exactly the
        releases of the published table (every load and write goes through it)."""
        return {unit: known_at for (unit, _), known_at in self.releases_known.items()}

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
        spec: UnitSetSpec = parsed.spec  # type: ignore[attr-defined]
        if self.runtime.tables.changed(self.key, self.store.version):
            self.published = None  # someone else wrote or deleted it: read it back
        if self.published is None:
            await self.load(spec, now)
        assert self.published is not None

        await self.watch(spec)
        everyone = pods_of(self.runtime.pods, self.namespace)
        members, rollout, problem = self.members(spec, everyone)
        loads, source, metrics_problem = await self.loads(spec, members, now)
        ack = self.set_ref.ack_annotation
        views = tuple(sorted((pod.for_set(ack) for pod in members), key=lambda v: v.name))
        # Owners that are no longer selected but still run may still serve their units: they
        # hand them off like draining members instead of losing them unfenced.
        uids = self.published.member_uids
        owners = {name for name, units in self.published.by_member().items() if units}
        selected = {pod.uid for pod in members}
        departed = tuple(
            sorted(
                (
                    pod.for_set(ack)
                    for pod in everyone
                    if pod.name in owners
                    and uids.get(pod.name) == pod.uid
                    and pod.uid not in selected
                ),
                key=lambda v: v.name,
            )
        )
        if self.fence_until is not None:
            if now < self.fence_until:
                problem = problem or self.fence_problem
            else:
                self.fence_until = self.fence_problem = None
        # Load figures change with every scrape: with them, plan at most once per interval.
        interval = spec.rebalance.interval.total_seconds()
        load_tick = None if loads is None else int(now // interval)
        fingerprint = (
            self.generation,
            self.published.epoch,
            views,
            departed,
            rollout,
            load_tick,
            problem,
            metrics_problem,
        )
        due = self.wake_at is not None and now >= self.wake_at
        if fingerprint == self.fingerprint and not due:
            return self.wake_at

        if problem is not None:
            result = PassResult(decision=None, problems=(problem,))
        else:
            with telemetry.timed(telemetry.PLAN_DURATION, self.labels):
                result = plan_pass(
                    PassInput(
                        spec=spec,
                        published=self.published,
                        generation=self.generation,
                        pods=views,
                        now=now,
                        last_round=self.last_round,
                        rollout=rollout,
                        loads=loads,
                        departed=departed,
                        desired_members=self.desired_members if spec.workload_ref else None,
                        created=_seconds(self.body["metadata"].get("creationTimestamp")),
                        releases_known=self.known_releases(),
                    )
                )
            self.count_moves(result)
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
        self.update_costs(everyone)
        self.fingerprint = fingerprint
        self.wake_at = result.wake_at
        if load_tick is not None:
            self.wake_at = min(self.wake_at or math.inf, (load_tick + 1) * interval)
        if self.timed_out is not None:
            self.wake_at = min(t for t in (self.wake_at, self.timed_out[0]) if t is not None)
        if self.fence_until is not None:
            self.wake_at = min(self.wake_at or math.inf, self.fence_until)
        if self.loads_missing_since is not None:
            # Scrapes run when a pass asks for figures: until the workers report, pass once a
            # scrape interval, so the figures are fresh when they come and the grace is kept.
            assert spec.metrics.scrape is not None
            due = now + spec.metrics.scrape.interval.total_seconds()
            self.wake_at = min(self.wake_at or math.inf, due)
        return self.wake_at

    async def loads(
        self, spec: UnitSetSpec, members: Sequence[WorkerPod], now: float
    ) -> tuple[Mapping[str, float] | None, MetricsSource, Problem | None]:
        """Per-unit load the workers report, when the spec says where to scrape it."""
        if spec.metrics.scrape is None or not members:
            self.loads_missing_since = None
            return None, MetricsSource.COUNTS, None
        report = await self.runtime.metrics.unit_loads(
            self.namespace, self.set_ref.name, members, spec.metrics
        )
        if report.unit_loads is None:
            self.known_loads.clear()
            # Workers report a unit's load once they serve it: while the first table is new,
            # none may have yet. Counting units meanwhile is no fault; only an absence that
            # outlasts `loads_grace` is (Prometheus' `for:` on an alert, in effect).
            since = self.loads_missing_since = self.loads_missing_since or now
            if now < since + loads_grace(spec.metrics.scrape):
                return None, MetricsSource.COUNTS, None
            return None, report.source, Problem("MetricsUnavailable", report.message)
        self.loads_missing_since = None
        # A unit in hand-off is reported by nobody for a moment; its load did not vanish.
        self.known_loads.update(report.unit_loads)
        return dict(self.known_loads), report.source, None

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
        self, spec: UnitSetSpec, everyone: Sequence[WorkerPod]
    ) -> tuple[list[WorkerPod], Rollout, Problem | None]:
        """The selected pods, the rollout and, when members cannot be known, why."""
        if spec.workload_ref is None:
            members = select(everyone, spec.selector)
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
        members = select(everyone, spec.selector, selector)
        self.desired_members = workload.replicas
        return members, rollout_of(workload, members), None

    def count_moves(self, result: PassResult) -> None:
        if result.plan is not None:
            telemetry.MOVES_PLANNED.labels(*self.labels).inc(len(result.plan.moves))
        telemetry.MOVES_KEPT.labels(*self.labels).inc(len(result.kept))
        telemetry.MOVES_HELD.labels(*self.labels).inc(result.held)

    async def publish(self, result: PassResult, now: float) -> None:
        table = result.new_table
        assert table is not None and result.decision is not None and self.published is not None
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
        if result.round_started:
            self.last_round = now
        events = self.runtime.events
        if result.summary:
            events.post(self.set_ref, "Normal", "Rebalancing", "Rebalance", result.summary)
        for decision in result.decision.events:
            action = _ACTIONS.get(decision.reason, "Handoff")
            events.post(
                self.set_ref, decision.type, decision.reason.value, action, decision.message()
            )
            if decision.reason is Reason.HANDOFF_TIMED_OUT:
                timeout = self.kind_spec_timeout()
                until = now + max(TIMEOUT_REPORT_SECONDS, timeout)
                self.timed_out = (until, Problem("HandoffTimedOut", decision.message()))
        self.logger.info(
            "Published epoch %d: %s",
            table.epoch,
            "; ".join(e.message(sample=4) for e in result.decision.events) or "membership",
        )

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
        conditions = previous
        now = condition_time(time.time())
        for type_, value in ((ConditionType.READY, False), (ConditionType.DEGRADED, True)):
            conditions = set_condition(
                conditions,
                type_=type_,
                status=value,
                reason=reason,
                message=message,
                observed_generation=self.generation,
                now=now,
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
        if self.timed_out is not None and now >= self.timed_out[0]:
            self.timed_out = None
        problems = [*extra, *([self.timed_out[1]] if self.timed_out else [])]
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
                last_round=self.last_round,
                metrics_source=source,
                loads=loads,
                extra_problems=problems,
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
            since = _seconds(condition.get("lastTransitionTime"))
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

    def update_costs(self, everyone: Sequence[WorkerPod]) -> None:
        assert self.published is not None
        uids = self.published.member_uids
        holdings: dict[str, int] = {}
        for member, units in self.published.by_member().items():
            holdings[uids[member]] = len(units)
        costs = self.runtime.costs
        pods = {
            pod.uid: (pod.name, pod.deletion_cost)
            for pod in everyone
            if pod.uid in holdings or pod.deletion_cost is not None
        }
        costs.update(self.namespace, self.set_key, holdings, pods)
        costs.forget_pods(self.namespace, {pod.uid for pod in everyone})

    def release_pods(self) -> None:
        """The set is gone: its units no longer count in its pods' deletion costs."""
        everyone = pods_of(self.runtime.pods, self.namespace)
        pods = {pod.uid: (pod.name, pod.deletion_cost) for pod in everyone}
        self.runtime.costs.update(self.namespace, self.set_key, {}, pods)
        self.runtime.costs.forget_set(self.namespace, self.set_key)
        self.runtime.metrics.forget(self.namespace, self.set_ref.name)


def _timed_out_from(status: Mapping[str, Any]) -> tuple[float, Problem] | None:
    """A HandoffTimedOut the status reports stays reported for its full time after a restart
    or a failover: the standby reads it back instead of forgetting it."""
    degraded = next(
        (c for c in status.get("conditions") or () if c.get("type") == "Degraded"), None
    )
    if degraded is None or degraded.get("reason") != "HandoffTimedOut":
        return None
    since = _seconds(degraded.get("lastTransitionTime"))
    if since is None:
        return None
    return since + TIMEOUT_REPORT_SECONDS, Problem("HandoffTimedOut", degraded.get("message", ""))


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(math.ceil(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


LOADS_GRACE_MIN = 30.0
"""Seconds new workers get to start serving and reporting, however short the scrape interval."""


def loads_grace(scrape: ScrapeSpec) -> float:
    """How long workers may report no unit's load before it is a fault: two scrapes, and at
    least what a fleet of starting processes needs on a busy node."""
    return max(
        LOADS_GRACE_MIN, 2 * scrape.interval.total_seconds() + scrape.timeout.total_seconds()
    )
