"""Clients that count: each key gets numbered increments (1, 2, 3 …), one at a time, sent to the
demo workers' `POST /key/<id>?n=N` from a background thread. The acknowledged numbers are the
oracle: after N acknowledged increments of a key, its counter must be exactly N wherever it is.

A client knows no table: it asks any pod first, follows 421 answers to the owner they name,
waits on 503 (unit in hand-off or being split) and retries the same number until a 200 — so
a repeat never counts twice and a lost counter shows as a count below the number."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

RETRY_PAUSE = 0.05
TIMEOUT = aiohttp.ClientTimeout(total=5)


@dataclass(frozen=True)
class Served:
    """One acknowledged increment: the answer's pod, unit, token, count and server time."""

    key: str
    number: int
    pod: str
    unit: str
    token: int
    count: int
    time: float


@dataclass
class CountingClients:
    """`addresses()` → {pod: "ip:port"} of the workers, asked again when an answer names a pod
    it does not know; `keys` each send one increment every `interval` seconds."""

    addresses: Callable[[], dict[str, str]]
    keys: list[str]
    interval: float
    acknowledged: dict[str, int] = field(default_factory=dict)
    served: list[Served] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)
    _known: dict[str, str] = field(default_factory=dict)
    _owner: dict[str, str] = field(default_factory=dict)
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stopping: asyncio.Event | None = None
    _error: BaseException | None = None

    def start(self) -> None:
        self._known = self.addresses()
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._stopping = asyncio.Event()
            ready.set()
            try:
                self._loop.run_until_complete(self._run())
            except BaseException as error:  # reported by stop()
                self._error = error
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="counting-clients", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop sending new increments; return once every one sent is acknowledged."""
        assert self._loop is not None
        assert self._stopping is not None
        assert self._thread
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"increments still unacknowledged after {timeout:.0f}s")
        if self._error is not None:
            raise self._error

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            await asyncio.gather(*(self._drive(http, key) for key in self.keys))

    async def _drive(self, http: aiohttp.ClientSession, key: str) -> None:
        assert self._stopping is not None
        # Spread the keys' first sends over one interval.
        await asyncio.sleep(random.random() * self.interval)
        number = 0
        while not self._stopping.is_set():
            number += 1
            await self._increment(http, key, number)
            self.acknowledged[key] = number
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.interval)

    async def _increment(self, http: aiohttp.ClientSession, key: str, number: int) -> None:
        redirected = False
        while True:
            pod = self._owner.get(key) or random.choice(sorted(self._known))
            try:
                async with http.post(f"http://{self._known[pod]}/key/{key}?n={number}") as answer:
                    status, body = answer.status, await answer.json()
            except (aiohttp.ClientError, TimeoutError, KeyError):
                self.answers["error"] += 1
                self._owner.pop(key, None)
                await self._refresh()
                await asyncio.sleep(RETRY_PAUSE)
                continue
            self.answers[str(status)] += 1
            if status == 200:
                self.served.append(
                    Served(
                        key,
                        number,
                        body["pod"],
                        body["unit"],
                        body["token"],
                        body["count"],
                        body["time"],
                    )
                )
                self._owner[key] = body["pod"]
                return
            owner = body.get("owner")
            if owner:
                self._owner[key] = owner
                if owner not in self._known:
                    await self._refresh()
            # Follow one redirect at once; pods whose tables disagree may send it back.
            if status != 421 or redirected:
                await asyncio.sleep(RETRY_PAUSE)
            redirected = status == 421

    async def _refresh(self) -> None:
        self._known = await asyncio.to_thread(self.addresses) or self._known
