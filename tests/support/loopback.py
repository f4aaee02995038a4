"""An aiohttp application served on loopback at a free port, for the tests' scripted servers."""

from __future__ import annotations

from aiohttp import web


async def serve(app: web.Application) -> tuple[web.AppRunner, int]:
    """Start `app` on 127.0.0.1 at a port the kernel picks: its runner (to clean up) and port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    # The port the kernel picked: aiohttp keeps it on the listening sockets of its runner.
    (address, *_) = runner.addresses
    return runner, int(address[1])
