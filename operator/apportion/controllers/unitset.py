"""The placement loop of PartitionSets and ShardSets: one kopf daemon per set, level-triggered.

The daemon sleeps until something it reads changes in its namespace (a pod, a workload, the set
itself: see `wakeups`), a hand-off times out or a held rebalance round is due. Each pass reads
the indexed pods and workloads, runs `apportion.engine.unitset.plan_pass` and publishes what it
decided: at most one ConfigMap write per new table, then Events, the status and the pods'
deletion costs. All state lives in the API server: on start (operator restart, standby taking
over) the daemon decodes the published table and continues from its epoch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kopf
from pydantic import ValidationError

from apportion.api.assignment import AssignmentTable, ResourceRef
from apportion.api.common import WorkloadKind
from apportion.api.conditions import ConditionType, dump_conditions, set_condition
from apportion.api.resource import Resource
from apportion.api.unitset import MetricsSource, UnitSetSpec, assignment_config_map
from apportion.controllers.metrics import MetricsCollector
from apportion.controllers.pods import PodFact, find_ghosts, pods_of, select
from apportion.controllers.wakeups import wakeups
from apportion.controllers.workloads import find_workload, rollout_of
from apportion.engine.handoff import Reason
from apportion.engine.unitset import (
    PassInput,
    PassResult,
    PodView,
    Problem,
    Rollout,
    StatusInput,
    initial_table,
    plan_pass,
    unit_set_status,
)
from apportion.publishing.client import api, close
from apportion.publishing.configmaps import AssignmentStore, PublishConflict
from apportion.publishing.events import EventRecorder
from apportion.publishing.pods import DeletionCosts
from apportion.publishing.status import patch_status

_ACTIONS = {Reason.ASSIGNED: "Assign", Reason.RESHARDED: "Reshard"}

RESYNC_SECONDS = 300.0
"""A full pass at least this often, whatever the wake-ups say, starting with a check of the pod
index against the API server (`find_ghosts`); the first pass of a daemon does it too."""
RETRY_SECONDS = 2.0
"""Pause after a failed pass (API unreachable, a write rejected) before trying again."""
TIMEOUT_REPORT_SECONDS = 60.0
"""Degraded stays HandoffTimedOut at least this long (or one handoffTimeout) after a forced
reassignment, so that `kubectl get` shows it."""


class _QuietWakeups(logging.Filter):
    """kopf logs every handler's success at INFO; for our indexers and wake-up handlers that is
    a line per pod event. Keep those lines out of the operator's log."""

    HANDLERS = (
        "'pod_changed'",
        "'workload_changed'",
        "'wake'",
        "'apportion_pods'",
        "'apportion_statefulsets'",
        "'apportion_deployments'",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg if isinstance(record.msg, str) else ""
        return not (message.endswith(" succeeded.") and any(h in message for h in self.HANDLERS))


logging.getLogger("kopf.objects").addFilter(_QuietWakeups())


# ------------------------------------------------------------------------ process-wide writers


@dataclass
class Writers:
    """What every set daemon shares: the Event poster, the deletion-cost bookkeeping and the
    metrics collector (one scrape per pod and interval, whatever the number of sets)."""

    events: EventRecorder
    costs: DeletionCosts
    metrics: MetricsCollector


_writers: Writers | None = None


def writers() -> Writers:
    global _writers
    if _writers is None:
        client = api()
        _writers = Writers(EventRecorder(client), DeletionCosts(client), MetricsCollector(client))
    return _writers


# ------------------------------------------------------------------------------------ the loop


class SetLoop:
    """The daemon of one set. `body` is kopf's live body: it follows the object's changes."""

    def __init__(
        self,
        kind: type[Resource],
        body: kopf.Body,
        indexes: Mapping[str, Any],
        logger: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        meta = body["metadata"]
        self.kind = kind
        self.body = body
        self.indexes = indexes
        self.logger = logger
        self.namespace: str = meta["namespace"]
        self.set_ref = ResourceRef(kind.__name__, self.namespace, meta["name"], meta["uid"])
        self.config_map = assignment_config_map(kind.__name__, meta["name"])
        self.store = AssignmentStore(api(), self.set_ref, self.config_map)
        self.writers = writers()
        self.published: AssignmentTable | None = None
        self.exists = False  # whether the ConfigMap holds our table
        status = body.get("status") or {}
        self.last_round = _seconds(status.get("lastRebalanceTime"))
        self.status: dict[str, Any] | None = None
        self.reported: set[str] = set()
        self.timed_out: tuple[float, Problem] | None = None
        self.known_loads: dict[str, float] = {}
        self.ghosts: set[str] = set()
        self.fingerprint: tuple[Any, ...] | None = None
        self.wake_at: float | None = None
        self.resync_at = 0.0
        self._parsed: tuple[int, Resource | ValidationError] | None = None

    @property
    def set_key(self) -> str:
        return f"{self.set_ref.kind}/{self.set_ref.name}"

    async def run(self, stopped: kopf.DaemonStopped) -> None:
        halt = asyncio.ensure_future(stopped.wait())
        try:
            while not stopped:
                seen = wakeups.tick(self.namespace)
                try:
                    wake_at = await self.reconcile()
                except PublishConflict as conflict:
                    self.logger.info("%s; reloading the published assignment", conflict)
                    self.published = None
                    continue
                except Exception:
                    self.logger.exception("Placement pass failed; retrying")
                    self.fingerprint = None
                    wake_at = time.time() + RETRY_SECONDS
                now = time.time()
                timeout = min(self.resync_at, wake_at or math.inf) - now
                if timeout > 0:
                    wake = asyncio.ensure_future(wakeups.wait(self.namespace, seen, timeout))
                    await asyncio.wait({wake, halt}, return_when=asyncio.FIRST_COMPLETED)
                    wake.cancel()
        finally:
            halt.cancel()
            if stopped.reason and stopped.reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
                self.release_pods()

    async def load(self, spec: UnitSetSpec) -> None:
        """Continue from the published table; without one, from the epoch the status last
        reported (a lost ConfigMap never makes epochs go backwards)."""
        table = await self.store.load()
        self.exists = table is not None
        if table is None:
            epoch = (self.body.get("status") or {}).get("epoch") or 0
            table = initial_table(self.set_ref, spec, self.generation, epoch)
        self.published = table
        self.fingerprint = None
        self.logger.debug("Continuing from epoch %d", table.epoch)

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
        if now >= self.resync_at:
            self.resync_at, self.fingerprint = now + RESYNC_SECONDS, None
            indexed = self.indexes["apportion_pods"].get(self.namespace, ())
            self.ghosts = await find_ghosts(api(), self.namespace, indexed)
            if self.ghosts:
                self.logger.warning(
                    "Ignoring %d pod(s) the API server no longer has", len(self.ghosts)
                )
        parsed = self.parse()
        if isinstance(parsed, ValidationError):
            await self.report_invalid(f"spec rejected by the operator: {parsed.errors()[0]['msg']}")
            return None
        spec: UnitSetSpec = parsed.spec  # type: ignore[attr-defined]
        if self.published is None:
            await self.load(spec)
        assert self.published is not None

        everyone = pods_of(self.indexes["apportion_pods"], self.namespace, self.ghosts)
        members, rollout, problem = self.members(spec, everyone)
        loads, source, metrics_problem = await self.loads(spec, members, now)
        ack = self.set_ref.ack_annotation
        views = tuple(sorted((pod.view(ack) for pod in members), key=lambda v: v.name))
        # Owners that are no longer selected but still run may still serve their units: they
        # hand them off like draining members instead of losing them unfenced.
        uids = self.published.member_uids
        owners = {name for name, units in self.published.by_member().items() if units}
        selected = {pod.uid for pod in members}
        departed = tuple(
            sorted(
                (
                    pod.view(ack)
                    for pod in everyone
                    if pod.name in owners
                    and uids.get(pod.name) == pod.uid
                    and pod.uid not in selected
                ),
                key=lambda v: v.name,
            )
        )
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
                )
            )
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
        return self.wake_at

    async def loads(
        self, spec: UnitSetSpec, members: Sequence[PodFact], now: float
    ) -> tuple[Mapping[str, float] | None, MetricsSource, Problem | None]:
        """Per-unit load the workers report, when the spec says where to scrape it."""
        if spec.metrics.scrape is None or not members:
            return None, MetricsSource.COUNTS, None
        report = await self.writers.metrics.unit_loads(
            self.namespace, self.set_ref.name, [pod.ref for pod in members], spec.metrics
        )
        if report.unit_loads is None:
            self.known_loads.clear()
            return None, report.source, Problem("MetricsUnavailable", report.message)
        # A unit in hand-off is reported by nobody for a moment; its load did not vanish.
        self.known_loads.update(report.unit_loads)
        return dict(self.known_loads), report.source, None

    def members(
        self, spec: UnitSetSpec, everyone: Sequence[PodFact]
    ) -> tuple[list[PodFact], Rollout, Problem | None]:
        """The selected pods, the rollout and, when members cannot be known, why."""
        if spec.workload_ref is None:
            members = select(everyone, spec.selector)
            return members, rollout_of(None, members), None
        ref = spec.workload_ref
        indexes = {
            WorkloadKind.STATEFUL_SET: self.indexes["apportion_statefulsets"],
            WorkloadKind.DEPLOYMENT: self.indexes["apportion_deployments"],
        }
        workload = find_workload(indexes, self.namespace, ref.kind, ref.name)
        selector = workload.label_selector() if workload is not None else None
        if workload is None or selector is None:
            what = "does not exist" if workload is None else "has no usable selector"
            problem = Problem(
                "WorkloadNotFound",
                f"{ref.kind.value} {ref.name} {what}; the last published assignment is kept",
            )
            return [], Rollout(), problem
        members = select(everyone, spec.selector, selector)
        return members, rollout_of(workload, members), None

    async def publish(self, result: PassResult, now: float) -> None:
        table = result.new_table
        assert table is not None and result.decision is not None
        await self.store.publish(table)
        self.published, self.exists = table, True
        if result.round_started:
            self.last_round = now
        events = self.writers.events
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
        previous = (self.status or self.body.get("status") or {}).get("conditions") or ()
        conditions = previous
        for type_, value, reason in (
            (ConditionType.READY, False, "InvalidSpec"),
            (ConditionType.DEGRADED, True, "InvalidSpec"),
        ):
            conditions = set_condition(
                conditions,
                type_=type_,
                status=value,
                reason=reason,
                message=message,
                observed_generation=self.generation,
            )
        status = {"observedGeneration": self.generation, "conditions": dump_conditions(conditions)}
        if "InvalidSpec" not in self.reported:
            self.writers.events.post(self.set_ref, "Warning", "InvalidSpec", "Place", message)
            self.reported = {"InvalidSpec"}
        if status != self.status:
            await patch_status(api(), self.set_ref.kind, self.namespace, self.set_ref.name, status)
            self.status = status

    def kind_spec_timeout(self) -> float:
        parsed = self.parse()
        spec = getattr(parsed, "spec", None)
        return spec.rebalance.handoff_timeout.total_seconds() if spec is not None else 0.0

    async def report(
        self,
        result: PassResult,
        pods: Sequence[PodView],
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
                self.writers.events.post(
                    self.set_ref, "Warning", reason, "Place", current[reason].message
                )
        self.reported = set(current)
        if status != self.status:
            await patch_status(api(), self.set_ref.kind, self.namespace, self.set_ref.name, status)
            self.status = status

    def update_costs(self, everyone: Sequence[PodFact]) -> None:
        assert self.published is not None
        uids = self.published.member_uids
        holdings: dict[str, int] = {}
        for member, units in self.published.by_member().items():
            holdings[uids[member]] = len(units)
        costs = self.writers.costs
        pods = {
            pod.uid: (pod.name, pod.deletion_cost)
            for pod in everyone
            if pod.uid in holdings or pod.deletion_cost is not None
        }
        costs.update(self.namespace, self.set_key, holdings, pods)
        costs.forget_pods(self.namespace, {pod.uid for pod in everyone})

    def release_pods(self) -> None:
        """The set is gone: its units no longer count in its pods' deletion costs."""
        everyone = pods_of(self.indexes["apportion_pods"], self.namespace)
        pods = {pod.uid: (pod.name, pod.deletion_cost) for pod in everyone}
        self.writers.costs.update(self.namespace, self.set_key, {}, pods)
        self.writers.costs.forget_set(self.namespace, self.set_key)
        self.writers.metrics.forget(self.namespace, self.set_ref.name)


def _seconds(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


# --------------------------------------------------------------------------- registration


def register(kind: type[Resource]) -> None:
    """Run the placement daemon for every object of `kind` (PartitionSet or ShardSet)."""
    resource = (kind.group, kind.version, kind.crd.plural)

    async def place(
        body: kopf.Body,
        logger: logging.Logger,
        stopped: kopf.DaemonStopped,
        apportion_pods: kopf.Index[str, PodFact],
        apportion_statefulsets: kopf.Index[Any, Any],
        apportion_deployments: kopf.Index[Any, Any],
        **_: Any,
    ) -> None:
        indexes = {
            "apportion_pods": apportion_pods,
            "apportion_statefulsets": apportion_statefulsets,
            "apportion_deployments": apportion_deployments,
        }
        await SetLoop(kind, body, indexes, logger).run(stopped)

    async def changed(namespace: str, **_: Any) -> None:
        await wakeups.notify(namespace)

    # The daemon checks `stopped` between passes; a pass in flight is cancelled after the
    # backoff, which is safe: every write is conditional and the next daemon reloads.
    kopf.daemon(*resource, id="placement", cancellation_backoff=1.0, cancellation_timeout=10.0)(
        place
    )
    kopf.on.event(*resource, id="wake")(changed)


@kopf.on.cleanup()
async def close_writers(**_: Any) -> None:
    if _writers is not None:
        await _writers.events.flush()
        await _writers.events.close()
        await _writers.metrics.close()
        await _writers.costs.close()
    await close()
