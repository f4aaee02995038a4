"""A simulated container's command, run as a local process.

It runs in its own session so that SIGTERM and SIGKILL reach everything it started, and it
receives SIGTERM if the simulator itself dies, as a container would when its kubelet goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from apportion_dev.devcluster.processes import die_with_parent


class LocalProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        log: Path,
    ) -> LocalProcess:
        """Start `argv` with stdout and stderr appended to `log`. Raises OSError when the command
        cannot be executed."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as output:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=output,
                stderr=asyncio.subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        return cls(process)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    async def wait(self) -> int:
        return await self._process.wait()

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signum)

    def send_term(self) -> None:
        if self._process.returncode is None:
            self._signal_group(signal.SIGTERM)

    async def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds; returns the exit status (negative:
        killed by that signal)."""
        if self._process.returncode is None:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._process.wait()), max(grace, 0.0))
            except TimeoutError:
                self._signal_group(signal.SIGKILL)
        code = await self._process.wait()
        # Whatever the process left behind in its session goes too.
        self._signal_group(signal.SIGKILL)
        return code


def exit_status(code: int) -> int:
    """Container exit codes as the kubelet reports them: killed by signal N → 128 + N."""
    return 128 - code if code < 0 else code
