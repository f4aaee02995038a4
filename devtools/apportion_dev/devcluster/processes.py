"""Start and stop the dev-cluster's processes, and recognise them again from another shell.

Each process gets its own session, so Ctrl-C in the terminal reaches only the harness, which
then stops the children in order. A record keeps the pid together with the kernel's start time
of that pid, so `stop` from another shell never signals an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the pre-exec hook must not import or allocate.
_LIBC = ctypes.CDLL(None, use_errno=True)

# Popen objects of the children this interpreter started, so they are reaped (no zombies, no
# ResourceWarning) when they exit.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat: clock ticks after boot
    log: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),  # type: ignore[call-overload]
            start_time=int(data["start_time"]),  # type: ignore[call-overload]
            log=str(data["log"]),
        )


def die_with_parent(signum: int) -> Callable[[], None]:
    """A pre-exec hook that has the kernel send `signum` to the child when the process that
    started it dies, even by SIGKILL, so an attached cluster never outlives its test run."""

    def hook() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)

    return hook


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    attached: bool = True,
    orphan_signal: int = signal.SIGKILL,
) -> ProcessRecord:
    """Start `argv` in a new session with stdout and stderr appended to `log`. Attached processes
    receive `orphan_signal` when this interpreter dies; detached ones outlive it (for
    `apportion dev-cluster start`). SIGKILL suits the servers: when the harness is gone nothing
    remains worth a graceful shutdown, and kube-apiserver's SIGTERM handling waits for an etcd
    that is shutting down at the same moment."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(orphan_signal) if attached else None,
        )
    _CHILDREN[process.pid] = process
    return ProcessRecord(name, process.pid, _start_time(process.pid) or 0, str(log))


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time) of a pid, None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after its last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def _start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[1] if stat else None


def is_running(record: ProcessRecord) -> bool:
    child = _CHILDREN.get(record.pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[record.pid]
        return False
    stat = _stat(record.pid)
    return stat is not None and stat[0] != "Z" and stat[1] == record.start_time


def _signal(record: ProcessRecord, signum: int) -> None:
    if is_running(record):
        with contextlib.suppress(ProcessLookupError):
            # The whole session's process group: a child's own children go too.
            os.killpg(record.pid, signum)


def terminate(records: Sequence[ProcessRecord], grace: float = 10.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL whatever is left, and wait until all
    are gone."""
    for record in records:
        _signal(record, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(is_running(r) for r in records) and time.monotonic() < deadline:
        time.sleep(0.05)
    for record in records:
        _signal(record, signal.SIGKILL)
    while any(is_running(r) for r in records):
        time.sleep(0.02)
    for record in records:
        child = _CHILDREN.pop(record.pid, None)
        if child is not None:
            child.wait()


def log_tail(record: ProcessRecord, lines: int = 25) -> str:
    try:
        text = Path(record.log).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
