"""Events (events.k8s.io/v1) about a set: each rebalance round and hand-off decision, and the
problems only the operator can judge. `kubectl describe` shows them under the set.

Posting never delays placement: events are queued and sent by one background task per process;
a failure is logged, never raised (Events are best-effort by design).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from lightkube import ApiError, AsyncClient
from lightkube.resources.events_v1 import Event

from apportion import API_VERSION
from apportion.api.assignment import ResourceRef
from apportion.publishing.client import decode, going_away

logger = logging.getLogger(__name__)

REPORTING_CONTROLLER = "apportion.dev/operator"
NOTE_LIMIT = 1024
QUEUE_LIMIT = 1000

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class SetEvent:
    set_ref: ResourceRef
    type: EventType
    reason: str
    action: str
    note: str


class EventRecorder:
    """Queues Events and posts them in order from one task."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()
        self._queue: asyncio.Queue[SetEvent] | None = None
        self._task: asyncio.Task[None] | None = None

    def post(
        self, set_ref: ResourceRef, type_: EventType, reason: str, action: str, note: str
    ) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue(QUEUE_LIMIT)
            self._task = asyncio.create_task(self._drain(self._queue), name="apportion events")
        try:
            self._queue.put_nowait(SetEvent(set_ref, type_, reason, action, note))
        except asyncio.QueueFull:
            logger.warning("Event queue full; dropped %s %s: %s", reason, set_ref.name, note)

    async def flush(self) -> None:
        """Wait until every queued Event is posted (tests, shutdown)."""
        if self._queue is not None:
            await self._queue.join()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = self._queue = None

    async def _drain(self, queue: asyncio.Queue[SetEvent]) -> None:
        while True:
            event = await queue.get()
            try:
                await self.client.create(self._body(event))
            except (ApiError, OSError) as error:
                # Nobody reads the Events of a namespace being deleted: not worth a warning.
                quiet = isinstance(error, ApiError) and going_away(error)
                logger.log(
                    logging.DEBUG if quiet else logging.WARNING,
                    "Could not post Event %s for %s: %s",
                    event.reason,
                    event.set_ref.name,
                    error,
                )
            except Exception:  # a malformed Event must not kill the poster
                logger.exception("Could not post Event %s", event.reason)
            finally:
                queue.task_done()

    def _body(self, event: SetEvent) -> Event:
        ref = event.set_ref
        note = event.note if len(event.note) <= NOTE_LIMIT else event.note[: NOTE_LIMIT - 1] + "…"
        return decode(
            Event,
            {
                # As client-go names them: the object's name, a dot, a unique hex suffix.
                "metadata": {"name": f"{ref.name}.{time.time_ns():x}", "namespace": ref.namespace},
                "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "type": event.type,
                "reason": event.reason,
                "action": event.action,
                "note": note,
                "reportingController": REPORTING_CONTROLLER,
                "reportingInstance": self.instance,
                "regarding": {
                    "apiVersion": API_VERSION,
                    "kind": ref.kind,
                    "name": ref.name,
                    "namespace": ref.namespace,
                    "uid": ref.uid,
                },
            },
        )
