"""`PlacementDirector`: places new grain activations in-process from the placement tables the
operator publishes, one strategy instance per table (engine: `apportion.engine.grains`).

Offline it is fed tables by hand (`apply`); live, `apportion.grains._watch` keeps it current from
the API server. Either way `place` costs one strategy call: no I/O, no round trip.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from apportion.api.graintype import DEFAULT_GRAIN_TYPE
from apportion.api.placement_table import PlacementTableDocument
from apportion.api.worker_report import ACTIVATIONS, GRAIN_TYPE_LABEL, Sample
from apportion.engine.grains import (
    Explanation,
    GrainSpecError,
    GrainStrategy,
    PlacementContext,
    PlacementError,
    PlacementTable,
    StatelessWorkerPlacement,
    make_grain_strategy,
)

if TYPE_CHECKING:
    from lightkube import AsyncClient

    from apportion.grains._watch import TableWatch

logger = logging.getLogger(__name__)

_MAX_CALL_CONTEXTS = 4096

PLACEMENTS = "apportion_grain_placements"
STARTED = "apportion_grain_activations_started"
TABLE_VERSION = "apportion_grain_placement_table_version"
METRIC_HELP = {
    PLACEMENTS: "Placements this worker decided, by grain type and chosen member (cumulative).",
    STARTED: "Grain activations started on this worker, by grain type (cumulative).",
    TABLE_VERSION: "Version of each GrainType's placement table this worker places with.",
}
"""Families the director serves besides `apportion_activations` (docs/placement-table.md)."""


class NoPlacementTable(PlacementError):
    """No GrainType places this grain type and the namespace has no `default` GrainType."""


def _spec_key(doc: PlacementTableDocument) -> str:
    return json.dumps(
        [doc.strategy.model_dump(mode="json"), [f.model_dump(mode="json") for f in doc.filters]],
        sort_keys=True,
    )


class _Placer:
    """One GrainType's table and the strategy instance placing against it."""

    __slots__ = ("doc", "error", "spec_key", "stateless", "strategy")

    def __init__(self, doc: PlacementTableDocument, rng: random.Random) -> None:
        self.doc = doc
        self.spec_key = _spec_key(doc)
        self.error: str | None = None
        self.strategy: GrainStrategy | None = None
        try:
            self.strategy = make_grain_strategy(
                doc.strategy.model_dump(mode="json", by_alias=True, exclude_none=True),
                [f.model_dump(mode="json", by_alias=True) for f in doc.filters],
                rng=random.Random(rng.getrandbits(64)),
            )
        except GrainSpecError as error:
            # The API server accepted it, but this worker cannot run it (a custom strategy
            # that is not installed here): every placement of these types says why.
            self.error = f"GrainType {doc.grain_type.name!r}: {error}"
        self.stateless = isinstance(self.strategy, StatelessWorkerPlacement)
        self.load(doc)

    def load(self, doc: PlacementTableDocument) -> None:
        self.doc = doc
        if self.strategy is not None:
            # A new table version resets the strategy's optimistic increments.
            self.strategy.update(PlacementTable.from_document(doc))


@dataclass(frozen=True, slots=True)
class GrainExplanation:
    """Which table decides a grain type, and the engine's account of the decision."""

    grain_type: str
    grain_id: str
    graintype: str | None
    """The GrainType resource whose table decides (None: no table)."""
    via_default: bool
    table_version: int | None
    published_at: datetime | None
    decision: Explanation | None
    error: str | None

    @property
    def chosen(self) -> str | None:
        return None if self.decision is None else self.decision.chosen

    def to_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "grainType": self.grain_type,
            "grainId": self.grain_id,
            "graintype": self.graintype,
            "viaDefault": self.via_default,
            "tableVersion": self.table_version,
            "publishedAt": None if self.published_at is None else self.published_at.isoformat(),
        }
        if self.decision is not None:
            decision = self.decision.to_dict()
            decision.pop("grainId")
            decision.pop("tableVersion")
            result.update(decision)
        else:
            result.update(chosen=None, error=self.error)
        return result


class PlacementDirector:
    """Answers `place(grain_type, grain_id, local_member, hint)` from the namespace's placement
    tables. A grain type is placed by the GrainType listing it in `grainTypes` (or named after
    it); without one, by the GrainType named `default`; without that, `NoPlacementTable`. When
    two GrainTypes claim one grain type, the one whose name sorts first wins (the operator marks
    both Degraded).

    Thread-safe: a lock serialises placements and table updates, because strategies keep
    optimistic state. It also counts what the worker tells it (`activated`/`deactivated`) and
    every placement it makes, for `/metrics`.
    """

    def __init__(self, local_member: str | None = None, *, rng: random.Random | None = None):
        self.local_member = local_member
        self._rng = rng if rng is not None else random.Random()
        self._lock = threading.Lock()
        self._placers: dict[str, _Placer] = {}  # GrainType name -> placer
        self._routes: dict[str, _Placer] = {}  # grain type name -> placer
        self._default: _Placer | None = None
        self._resolved: dict[str, _Placer] = {}  # grain types placed so far, defaults included
        self._contexts: dict[str | None, PlacementContext] = {}
        self._call_contexts: dict[tuple[str | None, str | None, int], PlacementContext] = {}
        self._listeners: list[Any] = []
        self.hosted: Counter[str] = Counter()
        """Activations of each grain type running on this member now."""
        self.started: Counter[str] = Counter()
        """Activations of each grain type started on this member since it began."""
        self._placed: dict[str, dict[str, int]] = {}  # grain type -> member -> placements
        self._local_grains: Counter[tuple[str, str]] = Counter()
        self._watch: TableWatch | None = None
        self._own_client: AsyncClient | None = None

    # ------------------------------------------------------------------------ live tables

    async def start(
        self,
        namespace: str | None = None,
        client: AsyncClient | None = None,
        *,
        timeout: float | None = 30.0,
    ) -> None:
        """Watch the placement tables of `namespace` (default: `$POD_NAMESPACE`, else the
        client's) and return once they are listed. Without `client`, one is made from the
        kubeconfig or the pod's service account, and closed by `stop`."""
        from lightkube import AsyncClient

        from apportion.grains._watch import TableWatch

        if self._watch is not None:
            raise RuntimeError("PlacementDirector is already watching")
        if client is None:
            client = self._own_client = AsyncClient()
        namespace = namespace or os.environ.get("POD_NAMESPACE") or client.namespace
        self._watch = TableWatch(self, namespace, client)
        try:
            await self._watch.start(timeout)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()
            self._watch = None
        if self._own_client is not None:
            await self._own_client.close()
            self._own_client = None

    async def __aenter__(self) -> PlacementDirector:
        if self._watch is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_for_table(
        self, grain_type: str, *, min_version: int = 0, timeout: float = 30.0
    ) -> int:
        """Wait until a table (own or `default`) places `grain_type` with at least
        `min_version`; returns its version. Needs `start`."""
        if self._watch is None:
            raise RuntimeError("PlacementDirector.start() first")
        return await self._watch.wait_for(grain_type, min_version=min_version, timeout=timeout)

    # ---------------------------------------------------------------------------- tables

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[PlacementTableDocument],
        local_member: str | None = None,
        *,
        rng: random.Random | None = None,
    ) -> PlacementDirector:
        """A director over fixed tables (tests, `apportion explain`, simulations)."""
        director = cls(local_member, rng=rng)
        for doc in docs:
            director.apply(doc)
        return director

    def apply(self, doc: PlacementTableDocument) -> bool:
        """Take a published table; False when it is not newer than the one held."""
        name = doc.grain_type.name
        with self._lock:
            current = self._placers.get(name)
            same_object = current is not None and current.doc.grain_type.uid == doc.grain_type.uid
            if current is not None and same_object and doc.version <= current.doc.version:
                return False
            if current is not None and same_object and current.spec_key == _spec_key(doc):
                routes_changed = (current.doc.grain_types, current.doc.default) != (
                    doc.grain_types,
                    doc.default,
                )
                current.load(doc)
                if routes_changed:
                    self._reroute()
            else:
                self._placers[name] = _Placer(doc, self._rng)
                self._reroute()
        self._notify()
        return True

    def remove(self, graintype: str) -> None:
        """The table of GrainType `graintype` is gone (the GrainType was deleted)."""
        with self._lock:
            if self._placers.pop(graintype, None) is not None:
                self._reroute()
        self._notify()

    def retain(self, graintypes: Iterable[str]) -> None:
        """Drop every table not in `graintypes` (after a relist)."""
        keep = set(graintypes)
        for name in [n for n in self._placers if n not in keep]:
            self.remove(name)

    def tables(self) -> dict[str, PlacementTableDocument]:
        """The tables held, by GrainType name."""
        with self._lock:
            return {name: placer.doc for name, placer in self._placers.items()}

    def on_change(self, callback: Any) -> None:
        """Call `callback()` after every table change (the watcher uses it to wake waiters)."""
        self._listeners.append(callback)

    def _notify(self) -> None:
        for callback in self._listeners:
            callback()

    def _reroute(self) -> None:
        routes: dict[str, _Placer] = {}
        for name in sorted(self._placers):
            placer = self._placers[name]
            for grain_type in placer.doc.grain_types:
                routes.setdefault(grain_type, placer)
        self._routes = routes
        self._resolved = {}
        default = self._placers.get(DEFAULT_GRAIN_TYPE)
        self._default = default if default is not None and default.doc.default else None

    def _resolve(self, grain_type: str) -> _Placer:
        placer = self._routes.get(grain_type) or self._default
        if placer is None:
            raise NoPlacementTable(
                f"no placement table for grain type {grain_type!r}: create a GrainType listing "
                f"it in spec.grainTypes, or a GrainType named {DEFAULT_GRAIN_TYPE!r} in this "
                "namespace"
            )
        return placer

    def table_for(self, grain_type: str) -> PlacementTableDocument | None:
        """The table that places `grain_type` now, or None."""
        with self._lock:
            try:
                return self._resolve(grain_type).doc
            except NoPlacementTable:
                return None

    # ------------------------------------------------------------------------- placement

    def _context(self, local_member: str | None) -> PlacementContext:
        ctx = self._contexts.get(local_member)
        if ctx is None:
            ctx = self._contexts[local_member] = PlacementContext(local_member=local_member)
        return ctx

    def _call_context(self, local: str | None, hint: str | None, count: int) -> PlacementContext:
        # Building a context costs more than a placement; hints and StatelessWorker counts take
        # few distinct values, so keep the ones in use.
        key = (local, hint, count)
        ctx = self._call_contexts.get(key)
        if ctx is None:
            if len(self._call_contexts) >= _MAX_CALL_CONTEXTS:
                self._call_contexts.clear()
            ctx = self._context(local).with_call(hint=hint, local_activations=count)
            self._call_contexts[key] = ctx
        return ctx

    def place(
        self,
        grain_type: str,
        grain_id: str,
        local_member: str | None = None,
        hint: str | None = None,
        *,
        local_activations: int | None = None,
    ) -> str:
        """The member a new activation of `grain_id` goes to. `local_member` defaults to the
        director's own; `hint` names a member to prefer when eligible. StatelessWorker counts
        this member's activations of the grain from `activated`/`deactivated` unless
        `local_activations` is given. Raises `PlacementError` (`NoPlacementTable`,
        `NoCompatibleMember`, `StatelessWorkerAtCapacity`)."""
        local = self.local_member if local_member is None else local_member
        with self._lock:
            placer = self._resolved.get(grain_type)
            if placer is None:
                placer = self._resolved[grain_type] = self._resolve(grain_type)
            strategy = placer.strategy
            if strategy is None:
                raise PlacementError(placer.error)
            if hint is not None or placer.stateless:
                if local_activations is None:
                    local_activations = self._local_grains.get((grain_type, grain_id), 0)
                ctx = self._call_context(local, hint, local_activations)
            else:
                ctx = self._contexts.get(local) or self._context(local)
            member = strategy.place(grain_id, ctx)
            # A flat dict per grain type: a Counter keyed by tuples costs as much as the
            # placement itself.
            placed = self._placed.get(grain_type)
            if placed is None:
                placed = self._placed[grain_type] = {}
            placed[member] = placed.get(member, 0) + 1
            return member

    @property
    def placements(self) -> Counter[tuple[str, str]]:
        """Placements this director decided, by (grain type, member)."""
        with self._lock:
            return Counter(
                {(t, m): n for t, members in self._placed.items() for m, n in members.items()}
            )

    def explain(
        self,
        grain_type: str,
        grain_id: str,
        local_member: str | None = None,
        hint: str | None = None,
    ) -> GrainExplanation:
        """What `place` would decide now, with candidates, filters and scores; changes nothing."""
        local = self.local_member if local_member is None else local_member
        with self._lock:
            try:
                placer = self._resolve(grain_type)
            except NoPlacementTable as error:
                return GrainExplanation(
                    grain_type, grain_id, None, False, None, None, None, str(error)
                )
            doc = placer.doc
            via_default = grain_type not in self._routes
            if placer.strategy is None:
                return GrainExplanation(
                    grain_type,
                    grain_id,
                    doc.grain_type.name,
                    via_default,
                    doc.version,
                    doc.published_at,
                    None,
                    placer.error,
                )
            ctx = self._context(local).with_call(
                hint=hint, local_activations=self._local_grains.get((grain_type, grain_id), 0)
            )
            decision = placer.strategy.explain(grain_id, ctx)
            return GrainExplanation(
                grain_type,
                grain_id,
                doc.grain_type.name,
                via_default,
                doc.version,
                doc.published_at,
                decision,
                decision.error,
            )

    # ------------------------------------------------------------- local activations

    def activated(self, grain_type: str, grain_id: str) -> None:
        """An activation of `grain_id` started on this member."""
        with self._lock:
            self.hosted[grain_type] += 1
            self.started[grain_type] += 1
            placer = self._routes.get(grain_type) or self._default
            if placer is not None and placer.stateless:
                self._local_grains[grain_type, grain_id] += 1

    def deactivated(self, grain_type: str, grain_id: str) -> None:
        """An activation of `grain_id` on this member ended."""
        with self._lock:
            if self.hosted[grain_type] > 0:
                self.hosted[grain_type] -= 1
            key = (grain_type, grain_id)
            if key in self._local_grains:
                self._local_grains[key] -= 1
                if self._local_grains[key] <= 0:
                    del self._local_grains[key]

    def counts(self) -> Mapping[str, Any]:
        """A consistent copy of the counters, for `/metrics`."""
        with self._lock:
            return {
                "hosted": dict(self.hosted),
                "started": dict(self.started),
                "placements": {
                    (t, m): n for t, members in self._placed.items() for m, n in members.items()
                },
                "tables": {n: p.doc.version for n, p in self._placers.items()},
            }

    def samples(self) -> list[Sample]:
        """What the worker serves on `/metrics` for grain placement: `apportion_activations`
        (the metrics contract, read back by the operator into `activationCount`) and the
        families of `METRIC_HELP`. Render with `apportion.api.worker_report.render(samples,
        helps=METRIC_HELP)`."""
        counts = self.counts()
        out = [
            Sample(ACTIVATIONS, n, {GRAIN_TYPE_LABEL: t})
            for t, n in sorted(counts["hosted"].items())
        ]
        out += [
            Sample(STARTED, n, {GRAIN_TYPE_LABEL: t}) for t, n in sorted(counts["started"].items())
        ]
        out += [
            Sample(PLACEMENTS, n, {GRAIN_TYPE_LABEL: t, "member": m})
            for (t, m), n in sorted(counts["placements"].items())
        ]
        out += [
            Sample(TABLE_VERSION, v, {"graintype": g}) for g, v in sorted(counts["tables"].items())
        ]
        return out
