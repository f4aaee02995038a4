"""etcd backed up and restored under a running dev-cluster, as Kubernetes' own recovery
procedure does it (kubernetes.io, "Operating etcd clusters for Kubernetes", restoring): stop the
API server, restore etcd's data, start etcd, then the API server again. Everything else —
operators, simulated pods, real nodes — keeps running with the newer world in memory.

The backup is a crash-consistent copy of etcd's data directory, taken with etcd stopped
(SIGSTOP) for the copy: what a volume snapshot of an etcd member's disk is, which the same page
accepts as a backup. Restored as it is, without `etcdutl snapshot restore --bump-revision`,
the store's revision goes back below what every client saw: their watches resume from
resourceVersions from the future, the hostile case (`apportion.listwatch` notices it).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from apportion_dev.devcluster import processes
from apportion_dev.devcluster.processes import ProcessRecord

STOPPED_FOR_RESTORE = ("kube-controller-manager", "kube-apiserver", "etcd")
"""Stopped in this order (who talks to the API server first), started in the reverse."""


def backup(etcd: ProcessRecord, data_dir: Path, destination: Path) -> Path:
    """Copy `data_dir` to `destination` while etcd is stopped, then let it go on."""
    os.kill(etcd.pid, signal.SIGSTOP)
    try:
        shutil.copytree(data_dir, destination)
    finally:
        os.kill(etcd.pid, signal.SIGCONT)
    return destination


def command_of(record: ProcessRecord) -> tuple[list[str], dict[str, str]]:
    """The argv and environment `record` was started with: a restarted component listens on
    the same addresses with the same flags, so every client reaches it as before."""
    argv = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")[:-1]
    environ = Path(f"/proc/{record.pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
    return [a.decode() for a in argv], env


def restore(
    records: list[ProcessRecord],
    data_dir: Path,
    backup_dir: Path,
    wait_ready: Callable[[ProcessRecord], None],
    *,
    attached: bool,
) -> None:
    """Stop the components of STOPPED_FOR_RESTORE, put `backup_dir` in place of `data_dir`,
    start them again in reverse order, each once `wait_ready` returns for it. `records` (the
    cluster's process list) is updated in place, so stopping the cluster stops the new ones."""
    stopping = [_record(records, name) for name in STOPPED_FOR_RESTORE]
    commands = {r.name: command_of(r) for r in stopping}
    for record in stopping:  # one at a time: the API server never outlives its etcd
        processes.terminate([record])
    shutil.rmtree(data_dir)
    shutil.copytree(backup_dir, data_dir)
    for old in reversed(stopping):
        argv, env = commands[old.name]
        new = processes.spawn(old.name, argv, Path(old.log), env=env, attached=attached)
        records[records.index(old)] = new
        wait_ready(new)


def _record(records: Sequence[ProcessRecord], name: str) -> ProcessRecord:
    (found,) = (r for r in records if r.name == name)
    return found
