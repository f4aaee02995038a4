"""A pod's route to the API server that a test can cut, as iptables DROP in the pod's network
namespace does on a real node (tests/e2e/test_real_node_workloads.py): while cut, no byte moves
in either direction and nothing is closed, so a client learns of it only from its own timeouts;
bytes held meanwhile flow on when the cut is lifted, as TCP retransmits them. Connections opened
during a cut hang as a SYN to a dropped route does.

A process pod annotated `apportion.dev/simulate-api-relay: "true"` reaches the API server through
its own relay; `apportion.dev/simulate-api-cut: "true"` on the live pod cuts it, and removing the
annotation lifts the cut; the pod's condition `apportion.dev/SimulatedAPICut` says when either
is in effect (the annotation is only a request). The relay forwards TLS untouched: the pod's
kubeconfig names https://127.0.0.1:<relay port>, which the API server's certificate covers.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

RELAY_ANNOTATION = "apportion.dev/simulate-api-relay"
CUT_ANNOTATION = "apportion.dev/simulate-api-cut"
CUT_CONDITION = "apportion.dev/SimulatedAPICut"
_CHUNK = 65536


class ApiRelay:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"the API server address {upstream!r} names no host and port")
        self._upstream = (parts.hostname, parts.port)
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def cut(self) -> bool:
        return not self._open.is_set()

    @cut.setter
    def cut(self, cut: bool) -> None:
        if cut:
            self._open.clear()
        else:
            self._open.set()

    async def start(self) -> str:
        """Listens on a free loopback port; returns the address the pod's kubeconfig names."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"https://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _serve(self, down_reader: asyncio.StreamReader, down: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pumps.add(task)
        up: asyncio.StreamWriter | None = None
        try:
            await self._open.wait()
            up_reader, up = await asyncio.open_connection(*self._upstream)
            await asyncio.gather(self._pump(down_reader, up), self._pump(up_reader, down))
        except (OSError, asyncio.IncompleteReadError):
            pass  # either end went away: the other sees its connection end, as with a real route
        finally:
            self._pumps.discard(task)
            for writer in (down, up):
                if writer is not None:
                    writer.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while True:
            await self._open.wait()
            data = await source.read(_CHUNK)
            await self._open.wait()  # read just before a cut: held, as an unacknowledged segment
            if not data:
                with contextlib.suppress(OSError):
                    sink.write_eof()
                return
            sink.write(data)
            await sink.drain()
