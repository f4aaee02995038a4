"""The Java client's Worker (clients/java) against the real API server: it follows tables the
Python writer publishes (plain and chunked), acts on no replayed older table but takes it for
the API server gone back (an etcd restore) and acknowledges again naming the set, releases and
acknowledges on its own Pod, drains on SIGTERM, and cannot acknowledge for a newer pod of its
name. It runs as the sample `dev.apportion.client.sample.PrintingWorker`, one JSON line per
callback."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion.api.assignment import (
    AssignmentTable,
    Incarnation,
    Release,
    ResourceRef,
    UnitState,
    assignment_config_map,
    encode_assignment,
)
from apportion_dev.devcluster.kubeconfig import write_user_kubeconfig
from tests.support.java import CLIENT, classpath
from tests.support.unitset import WORKER_ACCOUNT

ROOT = assignment_config_map("ShardSet", "carts")
ACK = "apportion.dev/ack.shardset.carts"


@pytest.fixture(scope="module")
def client_classpath() -> str:
    return classpath(CLIENT)


class JavaWorker:
    """The sample worker as a process; `events` are its callback lines, in order."""

    def __init__(self, classpath: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._stderr = log.open("w")
        self.process = subprocess.Popen(
            [
                "java",
                "-cp",
                classpath,
                "dev.apportion.client.sample.PrintingWorker",
                "ShardSet",
                "carts",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.append(json.loads(line))

    def saw(self, event: str, units: list[str], epoch: int) -> bool:
        return {"event": event, "units": units, "epoch": epoch} in self.events

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self._reader.join(10)
        self._stderr.close()


@pytest.fixture
def bind_token(dev_cluster: Any, namespace: str, tmp_path: Path) -> Callable[[str], Path]:
    """`bind_token(pod)`: POD.kubeconfig with a token of the worker's own ServiceAccount (the
    apportion-worker role, under the worker policy) bound to the pod as it is now, as a kubelet
    mounts it; written again on each call."""

    def bind(pod: str) -> Path:
        uid = dev_cluster.kubectl(
            "get", "pod", pod, "-n", namespace, "-o", "jsonpath={.metadata.uid}"
        ).stdout
        token = dev_cluster.kubectl(
            "create", "token", WORKER_ACCOUNT, "-n", namespace, "--bound-object-kind", "Pod",
            "--bound-object-name", pod, "--bound-object-uid", uid,
        ).stdout  # fmt: skip
        return write_user_kubeconfig(
            tmp_path / f"{pod}.kubeconfig",
            dev_cluster.server,
            dev_cluster.ca_file,
            {"token": token.strip()},
            namespace,
        )

    return bind


@pytest.fixture
def start_java(
    dev_cluster: Any,
    namespace: str,
    client_classpath: str,
    tmp_path: Path,
    bind_token: Callable[[str], Path],
) -> Iterator[Callable[[str], JavaWorker]]:
    env = {k: v for k, v in dev_cluster.env.items() if "proxy" not in k.lower()}
    started: list[JavaWorker] = []

    def start(pod: str) -> JavaWorker:
        worker = JavaWorker(
            client_classpath,
            {
                **env,
                "KUBECONFIG": str(bind_token(pod)),
                "POD_NAME": pod,
                "POD_NAMESPACE": namespace,
            },
            tmp_path / f"java-{pod}-{len(started)}.log",
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def create_pod(kubectl: Any, namespace: str, name: str) -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "serviceAccountName": WORKER_ACCOUNT,
            "automountServiceAccountToken": False,  # the test binds the Java worker's token
            "containers": [{"name": "worker", "image": "example.invalid/worker"}],
        },
    }
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    return kubectl("get", "pod", name, "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout


def pod_ack(kubectl: Any, namespace: str, name: str) -> dict[str, Any] | None:
    found = kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
    if found.returncode:
        return None
    text = json.loads(found.stdout)["metadata"].get("annotations", {}).get(ACK)
    return None if text is None else json.loads(text)


def publish(kubectl: Any, namespace: str, table: AssignmentTable, **encoding: int) -> int:
    """Writes the table as the operator does (chunks first, root last); how many ConfigMaps."""
    root, *chunks = encode_assignment(table, **encoding)
    for part in (*chunks, root):
        doc = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": ROOT + part.suffix},
            **part.body(),
        }
        kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    return 1 + len(chunks)


def table(namespace: str, uid: str, epoch: int, units: dict[str, UnitState]) -> AssignmentTable:
    ref = ResourceRef("ShardSet", namespace, "carts", "set-uid")
    members = (Incarnation("w0", uid), Incarnation("w1", "uid-w1"))
    return AssignmentTable(ref, 1, "akka", len(units), epoch, members, units)


def test_java_worker_follows_acknowledges_and_drains(
    kubectl: Any, namespace: str, start_java: Any, wait_for: Any
) -> None:
    uid = create_pod(kubectl, namespace, "w0")
    own, other = (lambda token: UnitState("w0", token)), (lambda token: UnitState("w1", token))
    first = {"0": own(1), "1": own(1), "2": other(1), "3": other(1)}
    publish(kubectl, namespace, table(namespace, uid, 1, first))
    java = start_java("w0")
    wait_for(lambda: java.saw("acquire", ["0", "1"], 1), message="no acquire of epoch 1")

    releasing = dict(first, **{"1": UnitState("w0", 1, Release("w1", 1000.0, 2))})
    publish(kubectl, namespace, table(namespace, uid, 2, releasing))
    wait_for(lambda: java.saw("release", ["1"], 2), message="no release of unit 1")
    wait_for(
        lambda: (
            pod_ack(kubectl, namespace, "w0")
            == {"uid": uid, "epoch": 2, "pending": [], "draining": False}
        ),
        message="no ack of epoch 2 on the pod",
    )

    # A chunked table: 3 in place of 1 on w1, 2 on w0.
    third = {"0": own(1), "1": other(3), "2": own(3), "3": other(1)}
    parts = publish(
        kubectl, namespace, table(namespace, uid, 3, third), inline_limit=0, chunk_limit=120
    )
    assert parts > 2
    wait_for(lambda: java.saw("acquire", ["2"], 3), message="no acquire from the chunked table")

    # A replay of epoch 1 would give unit 1 back and take unit 2: it is ignored. Epoch 4's
    # acquire comes after it on the same watch, so by then the replay was handled.
    publish(kubectl, namespace, table(namespace, uid, 1, first))
    fourth = {"0": own(1), "1": other(3), "2": own(3), "3": own(4)}
    publish(kubectl, namespace, table(namespace, uid, 4, fourth))
    wait_for(lambda: java.saw("acquire", ["3"], 4), message="no acquire of epoch 4")
    assert [e["epoch"] for e in java.events if e["event"] != "started"] == [1, 2, 3, 4]
    # ... but it tells the operator of the epoch it saw, naming the set (docs/handoff.md,
    # "When the cluster is restored from a backup"), in this ack and every one after.
    wait_for(
        lambda: (pod_ack(kubectl, namespace, "w0") or {}).get("set") == "set-uid",
        message="no ack naming the set after the older table",
    )

    java.process.send_signal(signal.SIGTERM)
    wait_for(
        lambda: (
            pod_ack(kubectl, namespace, "w0")
            == {"uid": uid, "epoch": 4, "pending": [], "draining": True, "set": "set-uid"}
        ),
        message="no draining ack after SIGTERM",
    )
    assert java.process.poll() is None  # still serving until the units are handed off
    fifth = {
        u: UnitState("w0", s.epoch, Release("w1", 1001.0, 5)) if s.owner == "w0" else s
        for u, s in fourth.items()
    }
    publish(kubectl, namespace, table(namespace, uid, 5, fifth))
    wait_for(lambda: java.process.poll() is not None, message="the drained worker did not exit")
    assert java.saw("release", ["0", "2", "3"], 5)
    assert pod_ack(kubectl, namespace, "w0") == {
        "uid": uid,
        "epoch": 5,
        "pending": [],
        "draining": True,
        "set": "set-uid",
    }
    assert not [e for e in java.events if e["event"] == "revoke"], java.events
    assert java.process.returncode == 128 + signal.SIGTERM


def test_java_worker_cannot_ack_for_a_newer_pod_of_its_name(
    kubectl: Any, namespace: str, start_java: Any, bind_token: Any, wait_for: Any
) -> None:
    old = create_pod(kubectl, namespace, "w0")
    units = {"0": UnitState("w0", 1), "1": UnitState("w1", 1)}
    publish(kubectl, namespace, table(namespace, old, 1, units))
    java = start_java("w0")
    wait_for(lambda: java.saw("acquire", ["0"], 1), message="no acquire of epoch 1")

    kubectl("delete", "pod", "w0", "-n", namespace, "--grace-period=1", "--timeout=60s")
    new = create_pod(kubectl, namespace, "w0")
    assert new != old
    # The old token died with the old pod; even valid credentials of the new incarnation (the
    # client reloads its kubeconfig on a 401) must not let the old process ack: the uid fence.
    bind_token("w0")
    # A table that still records the old incarnation and asks it to release: the old process
    # releases, and its ack, carrying the old uid, is refused by the API server.
    releasing = dict(units, **{"0": UnitState("w0", 1, Release("w1", 1000.0, 2))})
    publish(kubectl, namespace, table(namespace, old, 2, releasing))
    wait_for(lambda: java.saw("release", ["0"], 2), message="no release of unit 0")
    wait_for(
        lambda: "is gone; no more acks" in java.log.read_text(),
        message="the old process did not notice its ack was refused",
    )
    assert pod_ack(kubectl, namespace, "w0") is None


def test_java_worker_stops_serving_through_an_api_outage_longer_than_its_lease(
    dev_cluster: Any, kubectl: Any, namespace: str, start_java: Any, wait_for: Any
) -> None:
    """The Java worker's serving lease (issue 20): the API server SIGSTOPped (its connections
    hang) for longer than the table's 1 s lease: the worker suspends its units, and resumes
    them when the API server is back, releasing and revoking nothing for it; its one ack after
    it says only that it was suspended (for the operator's ServingSuspended report)."""
    uid = create_pod(kubectl, namespace, "w0")
    units = {"0": UnitState("w0", 1), "1": UnitState("w1", 1)}
    leased = dataclasses.replace(table(namespace, uid, 1, units), serving_lease=1.0)
    publish(kubectl, namespace, leased)
    java = start_java("w0")
    wait_for(lambda: java.saw("acquire", ["0"], 1), message="no acquire of epoch 1")
    acks = pod_ack(kubectl, namespace, "w0")
    api = dev_cluster.pid("kube-apiserver")
    os.kill(api, signal.SIGSTOP)
    try:
        wait_for(lambda: java.saw("suspend", ["0"], 1), timeout=15, message="never suspended")
    finally:
        os.kill(api, signal.SIGCONT)
    wait_for(lambda: java.saw("resume", ["0"], 1), timeout=30, message="never resumed")
    kinds = [e["event"] for e in java.events]
    assert "release" not in kinds, java.events
    assert "revoke" not in kinds, java.events
    told = wait_for(
        lambda: (ack := pod_ack(kubectl, namespace, "w0")) and "suspended" in ack and ack,
        message="the ack never told of the suspension",
    )
    assert told.pop("suspended")["count"] == 1
    # Nothing else: the epoch it had handled, nothing pending, not draining.
    assert told == {"uid": uid, "epoch": 1, "pending": [], "draining": False}
    assert acks in (None, told)
