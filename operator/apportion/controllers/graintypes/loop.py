"""The publishing loop of one GrainType, level-triggered like the unit sets'.

Each pass reads the GrainType (as the watch last delivered it), the pods it selects from the pod
cache and their smoothed load from the metrics collector, builds the placement table they call
for and lets
the gate decide: a change of spec or membership is written at once, a load change beyond the
hysteresis at most once per `publish.minInterval`, noise never. Passes run when a pod it selects
or the GrainType changes (wake-ups), every `publish.interval` for load, and when a held-back load
change comes due. On start the daemon continues from the published table's version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from apportion.api.assignment import ResourceRef
from apportion.api.graintype import GrainType
from apportion.api.placement_table import PlacementTableFormatError
from apportion.controllers import telemetry
from apportion.controllers.caches import Want
from apportion.controllers.pods import pods_of
from apportion.controllers.runtime import Runtime
from apportion.controllers.wakeups import loop_key
from apportion.engine.grains.document import build_document, counted_grain_types, is_compatible
from apportion.engine.grains.gate import PublishGate
from apportion.engine.grains.status import (
    GrainTypeProblem,
    blocked_status,
    build_status,
    claimed_grain_types,
    conflicts,
    invalid_status,
    problems,
)
from apportion.publishing.placement_table import PlacementTableStore
from apportion.publishing.status import patch_status

RESYNC_SECONDS = 300.0
"""A pass at least this often for an invalid spec (a valid one passes every publish.interval)."""


class GrainTypeLoop:
    """The loop of one GrainType."""

    def __init__(
        self,
        body: Mapping[str, Any],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        runtime: Runtime,
        *,
        clock: Any = time.monotonic,
    ) -> None:
        meta = body["metadata"]
        self.runtime = runtime
        self.last_body = body
        self.logger = logger
        self.clock = clock
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.key = loop_key("GrainType", self.namespace, self.name)
        self.ref = ResourceRef("GrainType", self.namespace, self.name, meta["uid"])
        self.store = PlacementTableStore(runtime.client, self.namespace, self.name)
        self.gate: PublishGate | None = None
        self.last_publish: str | None = None
        self.status: dict[str, Any] | None = None
        self.reported: set[str] = set()
        self.error: str | None = None
        self.labels = ("GrainType", self.namespace, self.name)
        self.outcome = "unchanged"

    def forget(self) -> None:
        self.gate = None

    async def failed(self, error: BaseException, retry_in: float) -> None:
        """A pass failed (API unreachable, a write refused): the status must not go on claiming
        Ready; Reconciling says the pass is retried (best effort: the API server may be what
        failed)."""
        message = (
            f"placement pass failed: {error or type(error).__name__}; retrying in {retry_in:.0f}s"
        )
        generation = self.body["metadata"].get("generation")
        status = {
            **(self.status or self.body.get("status") or {}),
            **blocked_status(
                generation, self.conditions(), "PassFailed", message, now=datetime.now(UTC)
            ),
        }
        try:
            await self.report(status, [GrainTypeProblem("PassFailed", message, blocking=True)])
        except Exception as failure:
            self.logger.warning("Could not report the failure in the status: %s", failure)

    def finish(self, deleted: bool) -> None:
        """Nothing to undo: the table goes with the GrainType through its owner reference."""

    def parse(self) -> GrainType | ValidationError:
        try:
            return GrainType.from_raw(self.body)
        except ValidationError as error:
            return error

    async def resume(self) -> PublishGate:
        """Continue from the published table: it is what candidates are compared with, so a
        restart rewrites nothing that did not change, and versions only grow (past the status's
        too, should the ConfigMap have been lost)."""
        published = await self.store.load()
        floor = (self.body.get("status") or {}).get("tableVersion") or 0
        return PublishGate(published, version_floor=floor)

    async def reconcile(self) -> float:
        """One pass; returns when (Unix seconds) the next is due although nothing changes."""
        return time.time() + await self.publish()

    async def publish(self) -> float:
        """One pass; returns the seconds until the next one is due although nothing changes."""
        wall = datetime.now(UTC)
        self.outcome = "unchanged"
        parsed = self.parse()
        if isinstance(parsed, ValidationError):
            message = f"spec rejected by the operator: {parsed.errors()[0]['msg']}"
            generation = self.body["metadata"].get("generation")
            found = [GrainTypeProblem("InvalidSpec", message, blocking=True)]
            status = invalid_status(generation, self.conditions(), message, now=wall)
            await self.report(status, found)
            return RESYNC_SECONDS
        spec = parsed.spec
        interval = spec.publish.interval.total_seconds()
        if self.gate is None:
            self.gate = await self.resume()
        gate = self.gate
        await self.runtime.pods.want(self.key, Want(self.namespace, (spec.selector,)))
        # The want is the selector alone: what the cache keeps for this key is the selection.
        selected = pods_of(self.runtime.pods.selected(self.namespace, self.key))
        members = [pod for pod in selected if is_compatible(pod)]
        report = await self.runtime.loads.member_stats(
            self.namespace,
            members,
            spec.metrics,
            grain_types=counted_grain_types(parsed),
        )
        now = self.clock()
        candidate = build_document(
            parsed, members, report.member_stats, version=gate.next_version, now=wall
        )
        decision = gate.consider(
            candidate,
            now,
            min_interval=spec.publish.min_interval.total_seconds(),
            hysteresis_percent=spec.publish.hysteresis_percent,
        )
        if decision.write:
            try:
                await self.store.write(candidate)
            except PlacementTableFormatError as error:
                self.error = str(error)
            else:
                self.error = None
                self.outcome = "published"
                gate.written(candidate, now)
                self.last_publish = candidate.published_at.strftime("%Y-%m-%dT%H:%M:%SZ")
                self.logger.info(
                    "Published placement table version %d (%d members): %s",
                    candidate.version,
                    len(candidate.members),
                    decision.change.reason,
                )
        found = problems(
            parsed,
            selected,
            gate.published,
            conflicts=self.conflicts(parsed),
            error=self.error,
            metrics=report.message,
        )
        status = build_status(
            parsed,
            selected,
            gate.published,
            found,
            conditions=self.conditions(),
            now=wall,
            last_publish_time=self.last_publish
            or (self.status or self.body.get("status") or {}).get("lastPublishTime"),
        )
        await self.report(status, found)
        if gate.published is not None:
            telemetry.TABLE_EPOCH.labels(*self.labels).set(gate.published.version)
        return decision.next_pass(interval)

    @property
    def body(self) -> Mapping[str, Any]:
        """The GrainType as the watch last delivered it."""
        self.last_body = self.runtime.body(self.key) or self.last_body
        return self.last_body

    def conflicts(self, graintype: GrainType) -> dict[str, list[str]]:
        """This GrainType's grain types that other GrainTypes of the namespace claim too."""
        claims = {
            other["metadata"]["name"]: claimed_grain_types(other)
            for other in self.runtime.bodies("GrainType", self.namespace)
        }
        return conflicts(self.name, graintype.grain_type_names(), claims)

    def conditions(self) -> list[Any]:
        return list((self.status or self.body.get("status") or {}).get("conditions") or ())

    async def report(self, status: dict[str, Any], found: Sequence[GrainTypeProblem]) -> None:
        """Status (when it changed) and a Warning Event for each problem as it appears."""
        for problem in found:
            if problem.reason not in self.reported:
                self.runtime.events.post(
                    self.ref, "Warning", problem.reason, "Publish", problem.message
                )
        self.reported = {p.reason for p in found}
        if status != self.status:
            await patch_status(self.runtime.client, "GrainType", self.namespace, self.name, status)
            self.status = status
