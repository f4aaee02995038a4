"""The pod simulator's cuttable route to the API server (apportion_dev.devcluster.podsim.relay):
bytes flow both ways; while cut, none arrive and no connection ends; after the cut they all
arrive."""

from __future__ import annotations

import asyncio

from apportion_dev.devcluster.podsim.relay import ApiRelay


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data.upper())
        await writer.drain()
    writer.close()


async def test_a_cut_holds_every_byte_until_it_is_lifted_and_ends_nothing() -> None:
    upstream = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    relay = ApiRelay(f"https://127.0.0.1:{port}")
    address = await relay.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", int(address.rsplit(":", 1)[1]))
    try:
        writer.write(b"before")
        await writer.drain()
        assert await reader.readexactly(6) == b"BEFORE"

        relay.cut = True
        writer.write(b"during")
        await writer.drain()
        answer = asyncio.ensure_future(reader.readexactly(6))
        # Many chances for the echo to come back while cut; none may, nor may the stream end.
        for _ in range(50):
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        assert not answer.done()

        relay.cut = False
        assert await asyncio.wait_for(answer, 10) == b"DURING"
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # an end passes through
    finally:
        writer.close()
        await relay.stop()
        upstream.close()


async def test_a_connection_opened_during_a_cut_reaches_nothing_until_it_is_lifted() -> None:
    upstream = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    relay = ApiRelay(f"https://127.0.0.1:{port}")
    relay.cut = True
    address = await relay.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", int(address.rsplit(":", 1)[1]))
    try:
        writer.write(b"hello")
        await writer.drain()
        answer = asyncio.ensure_future(reader.readexactly(5))
        await asyncio.sleep(0.2)
        assert not answer.done()
        relay.cut = False
        assert await asyncio.wait_for(answer, 10) == b"HELLO"
    finally:
        writer.close()
        await relay.stop()
        upstream.close()
