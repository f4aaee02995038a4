"""List, then watch from the list's resourceVersion: the one primitive the product follows the
API server with. The operator's caches (`controllers.caches`) and the worker libraries' table
watches (`worker._watch`, `grains._watch`, and through the worker `kafka`) all run `ListWatch`;
kopf's own watches of our kinds are the only others (docs/architecture.md says why).

It follows client-go's reflector:

- a LIST, paged, taken whole by `on_list`: a *replace* — what it does not hold is gone (deleted
  while nobody watched);
- a WATCH from the list's version with `allowWatchBookmarks=true`: every event advances the
  version it resumes from, and so does a BOOKMARK, the server's way of moving a quiet watch's
  version on (so that a resume after a long quiet does not ask for a compacted version);
- a watch the server ends (`timeoutSeconds`) is opened again at once from the last version
  seen; one that drops, fails or stays silent for `SILENCE_TIMEOUT` (a connection whose
  packets are dropped never ends by itself) likewise, after an exponential pause: nothing is
  listed again, nothing missed, nothing replayed;
- 410 Gone — the answer to a LIST page or a WATCH, or an ERROR event inside the stream — means
  the version was compacted away: the next round lists again;
- before resuming, a LIST of one object "not older than" the version to resume from: an API
  server whose etcd was restored from a backup holds less than that version, and a watch from
  it would stay silent until as many writes had been made again, then skip them. The server
  answers 504 ResourceVersionTooLarge instead, and the next round lists again (client-go's
  reflector lists again on that answer too; etcd's `--bump-revision` restores never need it).

lightkube builds the requests and holds the connection, credentials and errors; its own `watch`
neither asks for bookmarks nor says which version it resumes from, so the requests are sent
here (through its request builder).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, NoReturn, TypeVar, cast

import httpx2
from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.core.resource import Resource
from lightkube.core.selector import build_selector
from lightkube.models.meta_v1 import Status

logger = logging.getLogger(__name__)

WATCH_TIMEOUT = 300
"""Seconds after which the server ends a watch, which is then opened again from the last
version seen."""
SILENCE_TIMEOUT = 90.0
"""A watch that delivered nothing (not even a bookmark) for this long is given up and opened
again from the last version seen: a connection whose packets are dropped (no FIN) never ends by
itself."""
RETRY_MIN = 0.2
RETRY_MAX = 5.0
PAGE = 500
"""Objects per page of a LIST: what is parsed at once."""
TOO_LARGE = "ResourceVersionTooLarge"
"""The cause of a 504 for a version newer than anything the server holds."""

T = TypeVar("T")
E = TypeVar("E")

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Raw = dict[str, Any]
Selector = Mapping[str, Any]
"""label or field → value, or a `lightkube.operators` requirement."""


class WatchSilent(Exception):
    """A watch delivered nothing for longer than its silence bound."""


async def bounded(events: AsyncIterable[E], silence: float | None = None) -> AsyncIterator[E]:
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


def gone(error: BaseException) -> bool:
    """Whether `error` is the server's 410 Gone: the version asked for is compacted away."""
    return isinstance(error, ApiError) and error.status.code == 410


def from_the_future(error: BaseException) -> bool:
    """Whether `error` says the version asked for is newer than anything the server holds
    (504, cause ResourceVersionTooLarge): its store went back, restored from a backup."""
    if not isinstance(error, ApiError) or error.status.code != 504:
        return False
    causes = (error.status.details.causes if error.status.details else None) or ()
    return any(cause.reason == TOO_LARGE for cause in causes)


def restart_reason(error: BaseException) -> str:
    """Why a watch was restarted, for logs and metrics: expired (410), rewound (the server's
    store went back), silent, or error. The first two list again."""
    if gone(error):
        return "expired"
    if from_the_future(error):
        return "rewound"
    return "silent" if isinstance(error, WatchSilent) else "error"


@dataclass(frozen=True)
class Selection:
    """Which objects a `ListWatch` follows: a label and a field selector, as lightkube takes
    them (`{"app": "x"}`, `{"metadata.name": "y"}`)."""

    labels: Selector | None = None
    fields: Selector | None = None

    def params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self.labels:
            params["labelSelector"] = build_selector({**self.labels})
        if self.fields:
            params["fieldSelector"] = build_selector({**self.fields}, for_fields=True)
        return params


@dataclass(frozen=True)
class Timing:
    """How a `ListWatch` talks to the server: objects per LIST page, the seconds after which the
    server ends a watch, and the silence after which a watch is given up (None:
    SILENCE_TIMEOUT)."""

    page: int = PAGE
    watch_timeout: int = WATCH_TIMEOUT
    silence_timeout: float | None = None


class ListWatch(Generic[T]):
    """Follows the objects of `resource` in `namespace` (ALL_NS: every one) that match
    `labels` and `fields`, decoded by `decode` from their JSON, until cancelled:
    `on_list(items)` with each full list (the first, and each after a 410 or a restore),
    which must iterate
    `items` to its end; then `on_event(type, obj)` for each ADDED, MODIFIED or DELETED.

    `synced` is set once the first list has been handled; `relists` counts the lists after the
    first; `on_restart(reason)` hears of each watch that ended in an error (see
    `restart_reason`). A callback's exception counts as the watch's error: the event is
    delivered again when the watch resumes (from the version before it).
    """

    def __init__(
        self,
        client: AsyncClient,
        resource: type[Resource],
        namespace: str,
        *,
        decode: Callable[[Raw], T],
        on_list: Callable[[AsyncIterator[T]], Awaitable[None]],
        on_event: Callable[[EventType, T], Awaitable[None]],
        selection: Selection = Selection(),
        timing: Timing = Timing(),
        on_restart: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.decode = decode
        self.on_list = on_list
        self.on_event = on_event
        self.selectors = selection.params()
        self.timing = timing
        self.on_restart = on_restart
        where = "every namespace" if namespace == ALL_NS else repr(namespace)
        chosen = ", ".join(self.selectors.values())
        self.what = f"{resource.__name__}{f' ({chosen})' if chosen else ''} in {where}"
        self.synced = asyncio.Event()
        self.relists = 0
        self.version: str | None = None
        """The version a watch resumes from; None: the next round lists."""

    async def run(self) -> None:
        delay = RETRY_MIN
        resuming = False
        while True:
            try:
                if self.version is None:
                    await self._list()
                    delay = RETRY_MIN
                elif resuming:
                    await self._still_served()
                resuming = True
                if await self._watch():
                    delay = RETRY_MIN
            except asyncio.CancelledError:
                raise
            except Exception as error:
                reason = restart_reason(error)
                if reason in ("expired", "rewound"):
                    self.version = None
                resume = "listing again" if self.version is None else f"from {self.version}"
                (logger.info if reason != "error" else logger.warning)(
                    "watch of %s ended (%s); %s", self.what, error, resume
                )
                if self.on_restart is not None:
                    self.on_restart(reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)

    async def _list(self) -> None:
        versions: list[str] = []
        await self.on_list(self.items(versions))
        if not versions:
            raise RuntimeError(f"on_list left the list of {self.what} unfinished")
        if self.synced.is_set():
            self.relists += 1
        self.synced.set()
        self.version = versions[0]

    async def _still_served(self) -> None:
        """Raises the server's 504 ResourceVersionTooLarge when it holds nothing as new as the
        version to resume from (its answer comes after a few seconds' wait for a cache that
        lags behind); costs one object's LIST per resumed watch."""
        params = {
            **self.selectors,
            "limit": 1,
            "resourceVersion": self.version,
            "resourceVersionMatch": "NotOlderThan",
        }
        await self._page(params)

    async def items(self, versions: list[str] | None = None) -> AsyncIterator[T]:
        """One LIST, page by page; appends the version it was taken at to `versions`."""
        params: dict[str, Any] = {**self.selectors, "limit": self.timing.page}
        while True:
            body = json.loads(await self._page(params))
            meta = body.get("metadata") or {}
            for raw in body.get("items") or ():
                yield self.decode(raw)
            if not meta.get("continue"):
                if versions is not None:
                    versions.append(meta["resourceVersion"])
                return
            params["continue"] = meta["continue"]

    async def _watch(self) -> bool:
        """One watch from `version` until the server ends it; whether it delivered anything."""
        params = {
            **self.selectors,
            "resourceVersion": self.version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": self.timing.watch_timeout,
        }
        delivered = False
        async for line in bounded(self._lines(params), self.timing.silence_timeout):
            if not line:
                continue
            event = json.loads(line)
            kind, raw = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(status=cast(Status, Status.from_dict(raw)))
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                await self.on_event(kind, self.decode(raw))
            version = (raw.get("metadata") or {}).get("resourceVersion")
            if version:
                self.version = version
            delivered = True
        return delivered

    async def _lines(self, params: dict[str, Any]) -> AsyncIterator[str]:
        generic = self.client._client
        request = generic.prepare_request(
            "list", res=self.resource, namespace=self.namespace, watch=True, params=params
        )
        request.timeout = generic._watch_timeout  # no read timeout: `bounded` ends silence
        response = await generic._client.send(generic.build_adapter_request(request), stream=True)
        try:
            if response.is_error:
                await response.aread()
                _raise(response)
            async for line in response.aiter_lines():
                yield line
        finally:
            await response.aclose()

    async def _page(self, params: dict[str, Any]) -> bytes:
        generic = self.client._client
        request = generic.prepare_request(
            "list", res=self.resource, namespace=self.namespace, params=params
        )
        response = await generic._client.send(generic.build_adapter_request(request))
        if response.is_error:
            _raise(response)
        return response.content


def _raise(response: httpx2.Response) -> NoReturn:
    """The error lightkube raises for this answer: ApiError when the server says why."""
    if response.headers.get("Content-Type", "").startswith("application/json"):
        raise ApiError(request=response.request, response=response)
    response.raise_for_status()
    raise AssertionError("not an error")  # pragma: no cover


async def list_objects(
    client: AsyncClient,
    resource: type[Resource],
    namespace: str,
    *,
    decode: Callable[[Raw], T],
    labels: Selector | None = None,
    fields: Selector | None = None,
) -> list[T]:
    """One LIST as `ListWatch` takes it, without a watch: a cache filling a new want."""

    async def unused(*_: Any) -> None:
        raise AssertionError("a list_objects lister never runs")

    lister = ListWatch(
        client,
        resource,
        namespace,
        decode=decode,
        on_list=unused,
        on_event=unused,
        selection=Selection(labels, fields),
    )
    return [item async for item in lister.items()]
