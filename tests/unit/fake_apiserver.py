"""A scripted Kubernetes API server on loopback, for the list-then-watch primitive and its
users (`apportion.listwatch`): real HTTP through a real lightkube client, so the requests'
parameters, the paging, the watch streams and the errors are the ones the API server sees and
sends.

It keeps objects of any resource with the server's rules: one increasing resourceVersion, a
history of events a watch replays from the version it asks for, 410 Gone for a version older
than the last `compact()`, bookmarks to open watches that asked for them (`bookmark()`),
`timeoutSeconds`, paging with `limit`/`continue`, label selectors (equality terms; other terms
are not filtered on, so a list is a superset, as a key required twice makes it) and the
`metadata.name`/`metadata.namespace` field selectors. Faults: `drop()` cuts open watches
without a word, `mute()` leaves them open and silent; `gone_in_stream` answers a compacted
version with an ERROR event inside a 200 stream instead of an HTTP 410; `restore(backup())`
puts back what `backup()` saved, versions too, as an etcd restore does: as the API server
does then, a LIST `NotOlderThan` a version it does not hold yet is answered 504
ResourceVersionTooLarge, and a watch from such a version stays open and silent.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from lightkube import AsyncClient, KubeConfig

from tests.support.loopback import serve

Key = tuple[str, str, str]  # (plural, namespace, name)


@dataclass
class Request:
    verb: str  # list, watch, get
    plural: str
    namespace: str | None
    params: dict[str, str]


@dataclass
class _Stream:
    plural: str
    namespace: str | None
    labels: str
    fields: str
    bookmarks: bool
    muted: bool = False
    queue: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)


def _labels_match(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term or " " in term or "=" not in term:
            continue  # not filtered here: a superset
        key, value = term.replace("==", "=").split("=", 1)
        if labels.get(key) != value:
            return False
    return True


def _fields_match(selector: str, body: dict[str, Any]) -> bool:
    meta = body["metadata"]
    for term in filter(None, selector.split(",")):
        key, value = term.split("=", 1)
        if key == "metadata.name" and meta["name"] != value:
            return False
        if key == "metadata.namespace" and meta.get("namespace") != value:
            return False
    return True


class FakeApiServer:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.version = 0
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (version, type, object)
        self.compacted = 0
        self.gone_in_stream = False
        self.requests: list[Request] = []
        self.watching = asyncio.Event()
        self.before_list_returns: Callable[[], Awaitable[None]] | None = None
        """Runs once a LIST has its answer, before it is sent."""
        self._streams: list[_Stream] = []
        self._pages: dict[str, list[dict[str, Any]]] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --------------------------------------------------------------------------- the script

    def put(
        self,
        plural: str,
        namespace: str,
        name: str,
        labels: dict[str, str] | None = None,
        **content: Any,
    ) -> dict[str, Any]:
        """Create or replace an object; returns it as stored."""
        meta = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        return self.put_object(plural, {"metadata": meta, **content})

    def put_object(self, plural: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create or replace `body` (its metadata's name and namespace); returns it as stored."""
        self.version += 1
        body = copy.deepcopy(body)
        meta = body["metadata"]
        key = (plural, meta["namespace"], meta["name"])
        old = self.objects.get(key)
        meta["uid"] = old["metadata"]["uid"] if old else f"uid-{meta['name']}-{self.version}"
        meta["resourceVersion"] = str(self.version)
        self.objects[key] = body
        self._tell("MODIFIED" if old else "ADDED", plural, body)
        return body

    def delete(self, plural: str, namespace: str, name: str) -> None:
        self.version += 1
        body = copy.deepcopy(self.objects.pop((plural, namespace, name)))
        body["metadata"]["resourceVersion"] = str(self.version)
        self._tell("DELETED", plural, body)

    def compact(self) -> None:
        """Forget the history: a watch from any version before now is answered 410 Gone."""
        self.compacted = self.version
        self.history.clear()

    def bookmark(self) -> None:
        """A BOOKMARK at the current version to each open watch that allows them."""
        for stream in self._streams:
            if stream.bookmarks:
                stream.queue.put_nowait(
                    {
                        "type": "BOOKMARK",
                        "object": {"metadata": {"resourceVersion": str(self.version)}},
                    }
                )

    def mute(self) -> None:
        """Open watches hear nothing more and stay open: a connection whose packets are
        dropped."""
        for stream in self._streams:
            stream.muted = True

    def drop(self) -> None:
        """Cut every open watch (no final chunk: the client sees a broken stream)."""
        for stream in self._streams:
            stream.queue.put_nowait(None)

    def backup(self) -> tuple[dict[Key, dict[str, Any]], int]:
        return copy.deepcopy(self.objects), self.version

    def restore(self, backup: tuple[dict[Key, dict[str, Any]], int]) -> None:
        """The store as `backup` saved it; open watches are cut (the API server restarts)."""
        objects, self.version = copy.deepcopy(backup)
        self.objects = objects
        self.history = [h for h in self.history if h[0] <= self.version]
        self.drop()

    def requested(self, verb: str) -> list[Request]:
        return [r for r in self.requests if r.verb == verb]

    def full_lists(self) -> list[Request]:
        """The LISTs of everything, not the one-object checks a resumed watch makes first."""
        return [r for r in self.requested("list") if "resourceVersionMatch" not in r.params]

    # ------------------------------------------------------------------------------ serving

    def _tell(self, kind: str, plural: str, body: dict[str, Any]) -> None:
        self.history.append((self.version, kind, copy.deepcopy(body)))
        for stream in self._streams:
            if not stream.muted and self._selected(stream, plural, body):
                stream.queue.put_nowait({"type": kind, "object": copy.deepcopy(body)})

    @staticmethod
    def _selected(stream: _Stream, plural: str, body: dict[str, Any]) -> bool:
        meta = body["metadata"]
        return (
            plural == stream.plural
            and stream.namespace in (None, meta.get("namespace"))
            and _labels_match(stream.labels, meta.get("labels") or {})
            and _fields_match(stream.fields, body)
        )

    @staticmethod
    def _status(code: int, reason: str, message: str) -> web.Response:
        body = {"kind": "Status", "status": "Failure", "code": code, "reason": reason}
        return web.json_response({**body, "message": message}, status=code)

    def _too_large(self, wanted: int) -> web.Response:
        message = f"Timeout: Too large resource version: {wanted}, current: {self.version}"
        cause = {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
        body = {"kind": "Status", "status": "Failure", "code": 504, "reason": "Timeout"}
        details = {"causes": [cause], "retryAfterSeconds": 1}
        return web.json_response({**body, "message": message, "details": details}, status=504)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        parts = request.match_info["rest"].split("/")
        namespace = None
        if parts[0] == "namespaces" and len(parts) > 2:
            namespace, parts = parts[1], parts[2:]
        plural, name = parts[0], (parts[1] if len(parts) > 1 else None)
        params = dict(request.query)
        verb = "get" if name else "watch" if params.get("watch") == "true" else "list"
        self.requests.append(Request(verb, plural, namespace, params))
        if name is not None:
            found = self.objects.get((plural, namespace or "", name))
            if found is None:
                return self._status(404, "NotFound", f"{plural} {name!r} not found")
            return web.json_response(found)
        stream = _Stream(
            plural,
            namespace,
            params.get("labelSelector", ""),
            params.get("fieldSelector", ""),
            params.get("allowWatchBookmarks") == "true",
        )
        if verb == "list":
            wanted = int(params.get("resourceVersion") or 0)
            if params.get("resourceVersionMatch") == "NotOlderThan" and wanted > self.version:
                return self._too_large(wanted)
            answer = self._list(stream, params)
            if self.before_list_returns is not None:
                await self.before_list_returns()
            return answer
        return await self._watch(request, stream, params)

    def _list(self, stream: _Stream, params: dict[str, str]) -> web.Response:
        token = params.get("continue")
        if token is not None:
            items = self._pages.pop(token)
        else:
            items = [
                copy.deepcopy(body)
                for (plural, _, _), body in sorted(self.objects.items())
                if self._selected(stream, plural, body)
            ]
        limit = int(params.get("limit") or 0) or len(items) or 1
        page, rest = items[:limit], items[limit:]
        meta: dict[str, Any] = {"resourceVersion": str(self.version)}
        if rest:
            token = f"page-{len(self.requests)}"
            self._pages[token] = rest
            meta["continue"] = token
        return web.json_response({"kind": "List", "metadata": meta, "items": page})

    async def _watch(
        self, request: web.Request, stream: _Stream, params: dict[str, str]
    ) -> web.StreamResponse:
        since = int(params.get("resourceVersion") or self.version)
        if since < self.compacted:
            message = f"too old resource version: {since} ({self.compacted})"
            if not self.gone_in_stream:
                return self._status(410, "Expired", message)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await response.write(json.dumps(event).encode() + b"\n")

        if since < self.compacted:
            status = {"kind": "Status", "code": 410, "reason": "Expired", "message": message}
            await send({"type": "ERROR", "object": status})
            return response
        for version, kind, body in self.history:
            if version > since and self._selected(stream, stream.plural, body):
                await send({"type": kind, "object": copy.deepcopy(body)})
        self._streams.append(stream)
        self.watching.set()
        try:
            timeout = float(params.get("timeoutSeconds") or 3600)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    while (event := await stream.queue.get()) is not None:
                        await send(event)
            if event is None and request.transport is not None:
                request.transport.abort()  # a connection cut, not a watch ended
                return response
        finally:
            self._streams.remove(stream)
        return response

    # ------------------------------------------------------------------------------ running

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("GET", "/api/v1/{rest:.*}", self._handle)
        app.router.add_route("GET", "/apis/{group}/{version}/{rest:.*}", self._handle)
        self._runner, self.port = await serve(app)

    async def stop(self) -> None:
        self.drop()
        if self._runner is not None:
            await self._runner.cleanup()

    def client(self) -> AsyncClient:
        config = KubeConfig.from_dict(
            {
                "current-context": "fake",
                "clusters": [
                    {"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}
                ],
                "users": [{"name": "fake", "user": {"token": "fake"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            }
        )
        return AsyncClient(config=config, trust_env=False)


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[FakeApiServer, AsyncClient]]:
    server = FakeApiServer()
    await server.start()
    client = server.client()
    try:
        yield server, client
    finally:
        await client.close()
        await server.stop()
