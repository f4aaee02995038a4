"""List, then watch from the list's resourceVersion: the one loop both worker libraries follow
the API server with (assignment tables in `apportion.worker._watch`, placement tables in
`apportion.grains._watch`).

lightkube re-opens a watch the server ended (`server_timeout`) from the last version seen;
anything else — 410 Gone, a dropped connection, an unreachable API, a watch silent for
`SILENCE_TIMEOUT` — ends in a fresh list after an exponential pause, so no change is ever missed
for long and objects deleted while the watch was down are noticed by the relist (the caller sees
every list whole).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap

logger = logging.getLogger(__name__)

WATCH_TIMEOUT = 300
"""Seconds after which the server ends a watch and lightkube opens the next one from the last
version seen."""
SILENCE_TIMEOUT = 90.0
"""A watch that delivered nothing for this long is given up and replaced by a fresh list:
lightkube reads watches without a timeout, and a connection whose packets are dropped (no FIN)
never ends by itself. A quiet object costs one small list per this interval."""
RETRY_MIN = 0.2
RETRY_MAX = 5.0

T = TypeVar("T")


class WatchSilent(Exception):
    """A watch delivered nothing for longer than its silence bound."""


async def bounded(events: AsyncIterable[T], silence: float | None = None) -> AsyncIterator[T]:
    """`events`, ending in WatchSilent when nothing arrives for `silence` seconds (default
    SILENCE_TIMEOUT)."""
    if silence is None:
        silence = SILENCE_TIMEOUT
    iterator = aiter(events)
    try:
        while True:
            try:
                async with asyncio.timeout(silence):  # inline: no task per event
                    item = await anext(iterator)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise WatchSilent(f"nothing for {silence:.0f}s") from None
            yield item
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


OnList = Callable[[Sequence[dict[str, Any]]], Awaitable[None]]
OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]


def as_dict(obj: Any) -> dict[str, Any]:
    """lightkube objects and plain mappings (scripted test clients) alike."""
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


class ConfigMapListWatch:
    """Calls `on_list` with every list of the selected ConfigMaps of `namespace` (the first and
    each relist), then `on_event(type, object)` for each watch event, until cancelled.

    `synced` is set once the first list has been handled; `relists` counts the lists after the
    first one, each following a watch that ended in an error.
    """

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        *,
        on_list: OnList,
        on_event: OnEvent,
        fields: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        watch_timeout: int = WATCH_TIMEOUT,
        silence_timeout: float | None = None,
        what: str = "ConfigMaps",
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.on_list = on_list
        self.on_event = on_event
        selectors = {"fields": fields, "labels": labels}
        self.selectors: dict[str, Any] = {
            key: dict(value) for key, value in selectors.items() if value is not None
        }
        self.watch_timeout = watch_timeout
        self.silence_timeout = silence_timeout
        self.what = what
        self.synced = asyncio.Event()
        self.relists = 0

    async def run(self) -> None:
        delay = RETRY_MIN
        while True:
            try:
                listing = self.client.list(ConfigMap, namespace=self.namespace, **self.selectors)
                await self.on_list([as_dict(item) async for item in listing])
                self.synced.set()
                delay = RETRY_MIN
                watch = self.client.watch(
                    ConfigMap,
                    namespace=self.namespace,
                    resource_version=listing.resourceVersion,
                    server_timeout=self.watch_timeout,
                    **self.selectors,
                )
                async for event, obj in bounded(watch, self.silence_timeout):
                    await self.on_event(event, as_dict(obj))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # 410 Gone, connection loss, silence, API errors: relist
                gone = isinstance(error, ApiError) and error.status.code == 410
                log = logger.info if gone else logger.warning
                log("watch of %s in %r ended (%s); listing again", self.what, self.namespace, error)
                self.relists += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
