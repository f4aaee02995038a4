"""The worker library in a real process: `apportion demo-worker` in a simulated pod, with only the
worker RBAC of manifests/worker-rbac.yaml, follows assignment ConfigMaps the test writes in the
documented format (playing the operator), serves keys and /metrics on its pod IP, acknowledges
releases on its own Pod, and drains on SIGTERM."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from apportion.api.assignment import (
    Ack,
    AssignmentTable,
    Incarnation,
    Release,
    ResourceRef,
    UnitState,
    ack_annotation_key,
    assignment_config_map,
    encode_assignment,
)
from apportion.api.worker_report import WorkerReport
from tests.support.unitset import WORKER_ACCOUNT

KIND, SET = "PartitionSet", "demo"
ACK_KEY = ack_annotation_key(KIND, SET)
OTHER = Incarnation("w-1", "uid-of-w-1")  # a member that exists only in the tables
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def write_table(
    kubectl: Callable[..., Any], namespace: str, table: AssignmentTable, **encoding: int
) -> list[str]:
    """Publish `table` as the operator does: chunks first, then the root. The names written."""
    base = assignment_config_map(KIND, SET)
    root, *chunks = encode_assignment(table, **encoding)
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": base + part.suffix, "namespace": namespace},
            **part.body(),
        }
        for part in (*chunks, root)
    ]
    for doc in docs:
        kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    return [d["metadata"]["name"] for d in docs]


def http(url: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
    try:
        with _http.open(urllib.request.Request(url, method=method), timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


class AckWatch:
    """Every ack the Pod carried while watched, in order: a drained worker exits (and its pod
    goes) moments after its last ack, too soon for polling to be sure to see it."""

    def __init__(self, cluster: Any, namespace: str, name: str) -> None:
        self.seen: list[Ack] = []
        self._kubectl = subprocess.Popen(
            [
                str(cluster.bin_dir / "kubectl"),
                f"--kubeconfig={cluster.kubeconfig}",
                "get",
                "pod",
                name,
                "-n",
                namespace,
                "--watch",
                "-o",
                "json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._kubectl.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self._kubectl.stdout:
            buffer += line
            try:
                pod, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                continue
            buffer = buffer.lstrip()[end:]
            text = (pod["metadata"].get("annotations") or {}).get(ACK_KEY)
            if text and (not self.seen or self.seen[-1] != Ack.from_annotation(text)):
                self.seen.append(Ack.from_annotation(text))

    def stop(self) -> None:
        self._kubectl.kill()
        self._kubectl.wait(10)
        self._reader.join(10)


class WorkerPod:
    """One demo-worker process in a simulated pod named w-0."""

    def __init__(self, dev_cluster: Any, namespace: str) -> None:
        self.cluster = dev_cluster
        self.namespace = namespace
        self.name = "w-0"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "annotations": {"apportion.dev/simulate": "process"}},
            "spec": {
                "serviceAccountName": WORKER_ACCOUNT,
                "terminationGracePeriodSeconds": 60,
                "containers": [
                    {
                        "name": "worker",
                        "image": "apportion:test",
                        "command": [
                            "apportion",
                            "demo-worker",
                            "--kind",
                            KIND,
                            "--set",
                            SET,
                            "--port",
                            "8080",
                            "--load-profile",
                            "units:0=5,*=1.5",
                            # Releases take two seconds: time to see the unit fenced at once
                            # and the ack only once on_release has returned.
                            "--release-delay",
                            "2",
                        ],
                    }
                ],
            },
        }
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def get(self) -> dict[str, Any] | None:
        found = self.cluster.kubectl(
            "get", "pod", self.name, "-n", self.namespace, "-o", "json", check=False
        )
        return json.loads(found.stdout) if found.returncode == 0 else None

    def ack(self) -> Ack | None:
        pod = self.get()
        text = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(ACK_KEY)
        return Ack.from_annotation(text) if text else None

    def watch_acks(self) -> AckWatch:
        return AckWatch(self.cluster, self.namespace, self.name)

    def log(self) -> str:
        path = self.cluster.pod_log_path(self.namespace, self.name)
        return path.read_text(errors="replace") if path.exists() else ""

    def ownership(self) -> list[tuple[str, str, int, int]]:
        """(action, unit, epoch, token) of every ownership line, in order."""
        pattern = re.compile(
            r"^\d+\.\d+ (acquire|release|stop) unit=(\S+) epoch=(\d+) "
            r"token=(\d+) pod=w-0 set=PartitionSet/demo count=4$",
            re.MULTILINE,
        )
        return [(a, u, int(e), int(t)) for a, u, e, t in pattern.findall(self.log())]


def test_demo_worker_follows_the_assignment_acknowledges_and_drains(
    dev_cluster, kubectl, namespace, wait_for
) -> None:
    worker = WorkerPod(dev_cluster, namespace)
    wait_for(lambda: "started" in worker.log(), 60, f"worker never started:\n{worker.log()}")
    pod = worker.get()
    assert pod is not None
    me = Incarnation("w-0", pod["metadata"]["uid"])
    url = f"http://{pod['status']['podIP']}:8080"
    ref = ResourceRef(KIND, namespace, SET, "uid-of-the-set")

    def table(epoch: int, units: dict[str, UnitState]) -> AssignmentTable:
        return AssignmentTable(ref, 1, "netherite", 4, epoch, (me, OTHER), units)

    S = UnitState
    # Epoch 1: units 0 and 1 are w-0's.
    write_table(
        kubectl,
        namespace,
        table(1, {"0": S("w-0", 1), "1": S("w-0", 1), "2": S("w-1", 1), "3": S("w-1", 1)}),
    )
    wait_for(lambda: len(worker.ownership()) == 2, 30, f"no acquisitions:\n{worker.log()}")
    assert worker.ownership() == [("acquire", "0", 1, 1), ("acquire", "1", 1, 1)]
    # Keys by Netherite's `!n` suffix: key "k!n" belongs to unit n mod 4.
    status, _, body = http(f"{url}/key/order!1")
    answer = json.loads(body)
    assert status == 200
    assert isinstance(answer.pop("time"), float)
    assert answer == {
        "key": "order!1",
        "unit": "1",
        "pod": "w-0",
        "token": 1,
        "epoch": 1,
        "count": 0,
    }
    # Numbered increments count once: the third (a resent 1) does not.
    counted = [json.loads(http(f"{url}/key/order!1?n={n}", "POST")[2]) for n in (1, 2, 1)]
    assert [c["count"] for c in counted] == [1, 2, 2]
    status, headers, body = http(f"{url}/key/order!6")
    assert status == 421
    assert json.loads(body)["owner"] == "w-1"
    assert headers["Apportion-Owner"] == "w-1"
    status, headers, page = http(f"{url}/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    metrics = WorkerReport.parse(page)
    assert metrics.unit_loads == {"demo": {"0": 5.0, "1": 1.5}}  # owned units only
    assert metrics.cpu_count
    assert metrics.cpu_count >= 1
    assert metrics.memory_usage_bytes
    assert worker.ack() is None  # nothing to acknowledge yet: no write on the Pod

    # Epoch 2: unit 1 is released to w-1; the worker stops serving it and acknowledges.
    write_table(
        kubectl,
        namespace,
        table(
            2,
            {
                "0": S("w-0", 1),
                "1": S("w-0", 1, Release("w-1", time.time(), 2)),
                "2": S("w-1", 1),
                "3": S("w-1", 1),
            },
        ),
    )
    wait_for(lambda: http(f"{url}/key/order!1")[0] == 503, 30, "unit 1 still served")
    assert worker.ack() is None  # no new work for unit 1 at once; the ack waits for on_release
    ack = wait_for(worker.ack, 30, "no ack for the release of unit 1")
    assert worker.ownership()[-1] == ("release", "1", 2, 1)  # logged before the ack
    assert ack == Ack(uid=me.uid, epoch=2, pending=frozenset(), draining=False)
    # The counters went into the unit's Lease before the ack: the worker role may write it (a
    # refused write is logged and retried before the ack). The Lease names a set that does not
    # exist here, so the garbage collector may already have deleted it.
    assert "saving the state of unit" not in worker.log()
    status, _, body = http(f"{url}/key/order!1")
    assert status == 503
    assert json.loads(body)["reason"] == "in hand-off"

    # Epoch 3: the hand-off completed. Epoch 4 comes in chunks: unit 2 is w-0's now.
    write_table(
        kubectl,
        namespace,
        table(3, {"0": S("w-0", 1), "1": S("w-1", 3), "2": S("w-1", 1), "3": S("w-1", 1)}),
    )
    names = write_table(
        kubectl,
        namespace,
        table(4, {"0": S("w-0", 1), "1": S("w-1", 3), "2": S("w-0", 4), "3": S("w-1", 1)}),
        inline_limit=0,
        chunk_limit=120,
    )
    assert len(names) > 2  # chunk ConfigMaps and the root holding their index
    wait_for(
        lambda: ("acquire", "2", 4, 4) in worker.ownership(),
        30,
        f"unit 2 not acquired from a chunked table:\n{worker.log()}",
    )
    status, _, body = http(f"{url}/key/order!1")
    assert status == 421
    assert json.loads(body)["owner"] == "w-1"

    # SIGTERM (the pod is deleted): the worker marks itself draining on its Pod...
    acks = worker.watch_acks()
    kubectl("delete", "pod", "w-0", "-n", namespace, "--wait=false")
    drain = wait_for(
        lambda: (a := worker.ack()) is not None and a.draining and a,
        30,
        "no draining mark on the Pod",
    )
    assert drain.uid == me.uid
    assert drain.epoch == 4
    assert worker.get() is not None  # still there: it waits for its units to move away
    # ...the operator (the test) moves both units away; the worker releases, acks, and exits:
    # once its ack covers every release it holds nothing, so it need not wait for epoch 6.
    since = time.time()
    write_table(
        kubectl,
        namespace,
        table(
            5,
            {
                "0": S("w-0", 1, Release("w-1", since, 5)),
                "1": S("w-1", 3),
                "2": S("w-0", 4, Release("w-1", since, 5)),
                "3": S("w-1", 1),
            },
        ),
    )
    wait_for(lambda: worker.get() is None, 60, "the drained worker did not exit")
    acks.stop()
    assert acks.seen[-1] == Ack(uid=me.uid, epoch=5, pending=frozenset(), draining=True), (
        f"the draining worker's last ack was not for epoch 5: {acks.seen}"
    )
    assert worker.ownership()[-2:] == [("release", "0", 5, 1), ("release", "2", 5, 4)]
    log = worker.log()
    assert "drain timed out" not in log
    assert "Traceback" not in log
