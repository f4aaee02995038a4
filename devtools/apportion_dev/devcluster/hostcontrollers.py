"""A GitOps engine's controllers run as host processes against a dev-cluster (devcluster.flux,
devcluster.argocd): started together, ready when each one's probe says so, stopped together.
A subclass's `stop` first deletes the engine's own objects, whose finalizers need the
controllers running, then calls `terminate`."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from apportion_dev.devcluster.net import http_get
from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.processes import ProcessRecord, is_running, log_tail, terminate

Probe = Callable[[], bool]


def http_ok(url: str) -> Probe:
    return lambda: http_get(url)[0] == 200


def accepts(port: int) -> Probe:
    """For a server without an HTTP health endpoint (Redis): its port takes connections."""

    def probe() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    return probe


def wait_established(cluster: Any, crds: tuple[str, ...], timeout: float = 60.0) -> None:
    """Until the CRDs just applied are Established. (`kubectl wait` fails rather than waits on a
    CRD whose status the API server has not written yet.)"""
    deadline = time.monotonic() + timeout
    waiting = list(crds)
    while waiting:
        found = cluster.kubectl("get", "crd", *waiting, "-o", "json", check=False)
        listed = json.loads(found.stdout) if found.returncode == 0 else {"items": []}
        items = listed.get("items", [listed])  # one name: the object itself, not a List
        established = {
            crd["metadata"]["name"]
            for crd in items
            for c in crd.get("status", {}).get("conditions") or []
            if c["type"] == "Established" and c["status"] == "True"
        }
        waiting = [name for name in waiting if name not in established]
        if waiting and time.monotonic() > deadline:
            raise DevClusterError(f"CRDs not established after {timeout:.0f}s: {waiting}")
        if waiting:
            time.sleep(0.2)


class HostControllers:
    def __init__(self, cluster: Any, records: list[ProcessRecord]) -> None:
        self.cluster = cluster
        self.records = records

    @classmethod
    def started(
        cls, cluster: Any, records: list[ProcessRecord], ready: dict[str, Probe], timeout: float
    ) -> Self:
        """The controllers once every probe (by process name) passed, in order; if one exits or
        the timeout passes first, all are stopped and the error carries its log's tail."""
        deadline = time.monotonic() + timeout
        try:
            for record in records:
                while not ready[record.name]():
                    if not is_running(record):
                        raise DevClusterError(f"{record.name} exited:\n{log_tail(record)}")
                    if time.monotonic() > deadline:
                        raise DevClusterError(f"{record.name} not ready:\n{log_tail(record)}")
                    time.sleep(0.2)
        except BaseException:
            terminate(records)
            raise
        return cls(cluster, records)

    def running(self) -> dict[str, bool]:
        return {record.name: is_running(record) for record in self.records}

    def log(self, name: str) -> str:
        record = next(r for r in self.records if r.name == name)
        return Path(record.log).read_text(errors="replace")

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.cluster.kubectl("get", "-n", namespace, kind, name, "-o", "json").stdout
        )
        return found

    def terminate(self) -> None:
        terminate(self.records)

    def stop(self) -> None:
        self.terminate()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
