"""`apportion operator` as a process against the dev-cluster: every kind gets observedGeneration
and a Ready condition through the status subresource, `kubectl wait` works, the printer columns
show it, and kopf leaves only apportion.dev traces on the objects."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from apportion.api.unitset import UnitSetStatus

SELECTOR = {"matchLabels": {"app": "workers"}}
SPECS = {
    "PartitionSet": {"partitions": 8, "selector": SELECTOR},
    "ShardSet": {"shards": 100, "selector": SELECTOR, "strategy": {"name": "LeastShards"}},
    "GrainType": {"selector": SELECTOR},
}


class Operator:
    """`apportion operator` watching one namespace, logging to a file."""

    def __init__(self, dev_cluster, namespace: str, log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "apportion", "operator", "--namespace", namespace],
            env=dev_cluster.env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._out.close()
        return code

    def text(self) -> str:
        return self.log.read_text()


@pytest.fixture(scope="module")
def watched(dev_cluster, crds, tmp_path_factory) -> Iterator[tuple[str, Operator]]:
    """A namespace of our own and an operator watching only it (other tests may run operators
    of their own in the same cluster)."""
    namespace = f"skeleton-{uuid.uuid4().hex[:6]}"
    dev_cluster.kubectl("create", "namespace", namespace)
    operator = Operator(dev_cluster, namespace, tmp_path_factory.mktemp("operator") / "log")
    yield namespace, operator
    code = operator.stop()
    dev_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert code == 0, f"operator exited with {code}:\n{operator.text()}"


def create(dev_cluster, namespace: str, kind: str, name: str) -> None:
    body = {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": SPECS[kind],
    }
    dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def get(dev_cluster, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return json.loads(
        dev_cluster.kubectl("get", "-n", namespace, kind.lower(), name, "-o", "json").stdout
    )


# PartitionSet and ShardSet: Ready means every unit has a live owner (tests/e2e/test_partitionset*);
# GrainType: its table is published for members (tests/e2e/test_graintype.py). Without worker pods
# all of them report Degraded (NoMembers).
@pytest.mark.parametrize("kind", ["GrainType"])
def test_ready_and_observed_generation(dev_cluster, watched, kind: str) -> None:
    namespace, _ = watched
    name = f"{kind.lower()}-a"
    create(dev_cluster, namespace, kind, name)
    waited = dev_cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=condition=Degraded",
        f"{kind.lower()}/{name}",
        "--timeout=60s",
    )
    assert "condition met" in waited.stdout

    obj = get(dev_cluster, namespace, kind, name)
    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"] == 1
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    assert ready["reason"] == "NoMembers"
    assert ready["observedGeneration"] == 1
    assert ready["lastTransitionTime"].endswith("Z")


@pytest.mark.parametrize("kind", ["GrainType"])
def test_spec_change_is_observed_without_a_new_transition(
    dev_cluster, watched, wait_for, kind: str
) -> None:
    namespace, _ = watched
    name = f"{kind.lower()}-b"
    create(dev_cluster, namespace, kind, name)
    dev_cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=condition=Degraded",
        f"{kind.lower()}/{name}",
        "--timeout=60s",
    )
    before = get(dev_cluster, namespace, kind, name)["status"]["conditions"][0]
    patch = {"spec": {"metrics": {"podMetrics": False}}}
    dev_cluster.kubectl(
        "patch", "-n", namespace, kind.lower(), name, "--type=merge", "-p", json.dumps(patch)
    )

    def observed() -> dict | None:
        obj = get(dev_cluster, namespace, kind, name)
        generation = obj["metadata"]["generation"]
        return obj if obj["status"].get("observedGeneration") == generation == 2 else None

    obj = wait_for(observed, timeout=30, message="observedGeneration 2")
    ready = obj["status"]["conditions"][0]
    assert ready["type"] == before["type"]
    assert ready["observedGeneration"] == 2
    assert ready["lastTransitionTime"] == before["lastTransitionTime"]


def test_kopf_leaves_only_apportion_traces(dev_cluster, watched) -> None:
    namespace, operator = watched
    create(dev_cluster, namespace, "ShardSet", "traces")
    # No worker pods: the set reports Degraded (NoMembers) once its daemon ran.
    dev_cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Degraded", "shardset/traces", "--timeout=60s"
    )
    obj = get(dev_cluster, namespace, "ShardSet", "traces")
    # No finalizer: the daemon needs no cleanup before the set goes (docs/api.md).
    assert not obj["metadata"].get("finalizers")
    foreign = [
        a
        for a in obj["metadata"].get("annotations", {})
        if "kopf" in a.split("/")[0] or "zalando" in a
    ]
    assert foreign == []
    declared = {f.alias for f in UnitSetStatus.model_fields.values()}
    assert {"observedGeneration", "conditions"} <= set(obj["status"]) <= declared
    log = operator.text()
    assert "Traceback" not in log
    assert re.search(r"Handler '[^']+' (failed|is retried)", log) is None
