"""Running a command's main task until SIGTERM or Ctrl-C, which end it quietly."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any


async def until_signalled(main: Coroutine[Any, Any, None]) -> None:
    """Runs `main`; SIGTERM (the kubelet stopping the container) or SIGINT cancels it, and the
    cancellation they cause is the normal end, not an error."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        if not task.cancelled():
            raise
