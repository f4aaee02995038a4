"""The cluster restored from a backup under a running set (docs/handoff.md, "When the cluster is
restored from a backup"): Kubernetes' own procedure on a dev-cluster of this module's own
(`DevCluster.restore_etcd`: the API server stopped, etcd's data put back, both started again,
no revision bump), while the operator and the demo workers keep running with the newer world in
memory and their watches sit on resourceVersions from the future.

Between the backup and the restore, pod dw-2 is drained, so its units move to its siblings
through acknowledged hand-offs; the restore puts back the table that gave dw-2 its units, the
set's status with its older epoch reservation, and the pods' older acks, and takes the drain
mark away.

(a) The operator runs through the restore: it republishes what it remembers above every epoch
    used, nothing moves for the restore itself, and the next change — dw-2's units coming back
    now that the drain mark is gone — completes through acknowledgements, never waiting out
    handoffTimeout for acks the restore erased.
(b) The operator also restarts after the restore, with nothing in memory: the workers' acks,
    which name the set since they saw the API server go back, tell it which epochs were seen;
    it fences above them and places after handoffTimeout.

Both: no unit is served by two pods at once, no (unit, token) is acquired by two pods, and the
repair's epoch is above every epoch any worker logged. Figures are printed.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion.api.assignment import Ack
from apportion_dev.devcluster import DevCluster
from tests.e2e.conftest import install_crds, operator_identity
from tests.support.unitset import (
    Operator,
    Ownership,
    apply,
    demo_worker,
    events,
    get,
    grant_worker_role,
    overlaps,
    ownership_log,
    published,
    read_table,
    ready_pods,
    serving,
    unit_set,
    workers,
)
from tests.support.waiting import wait_for

SET, KIND = "demo", "PartitionSet"
PODS = [f"dw-{i}" for i in range(3)]
HANDOFF_TIMEOUT = 40


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with DevCluster.start(tmp_path_factory.mktemp("restore") / "cluster") as started:
        install_crds(started)
        yield started
        restarted = {name: started.pid(name) for name in ("etcd", "kube-apiserver")}
    # Stopping the cluster stopped the components the restores started, not the first ones.
    for name, pid in restarted.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} ({pid}) outlived the cluster"


@pytest.fixture
def namespace(cluster: DevCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "restore-" + request.node.name.split("[")[0][-20:].replace("_", "-").strip("-")
    cluster.kubectl("create", "namespace", name)
    wait_for(
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        30,
        "no default ServiceAccount",
    )
    grant_worker_role(cluster.kubectl, name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def start_operator(cluster: DevCluster, namespace: str, directory: Path) -> Operator:
    identity = operator_identity(cluster, directory)
    return Operator(cluster, namespace, directory / f"operator-{time.time():.0f}.log",
                    kubeconfig=identity)  # fmt: skip


def placed(cluster: DevCluster, namespace: str) -> dict[str, Any]:
    """3 demo workers and a PartitionSet of 12 over them, every unit served by its owner."""
    kubectl = cluster.kubectl
    apply(kubectl, namespace, workers("dw", 3, command=demo_worker(KIND, SET)))
    wait_for(lambda: len(ready_pods(kubectl, namespace, "app=dw")) == 3, 60, "3 demo workers")
    spec = {
        "partitions": 12,
        "workloadRef": {"kind": "StatefulSet", "name": "dw"},
        "rebalance": {"interval": "1s", "handoffTimeout": f"{HANDOFF_TIMEOUT}s"},
    }
    apply(kubectl, namespace, unit_set(KIND, SET, spec))
    wait_for(lambda: served_as_published(cluster, namespace), 90, "every unit served by its owner")
    return spec


def owners(cluster: DevCluster, namespace: str) -> dict[str, str | None]:
    """Unit → owner in the published table ({} before the first)."""
    table = read_table(cluster.kubectl, namespace, KIND, SET)
    return {} if table is None else {unit: state.owner for unit, state in table.units.items()}


def log(cluster: DevCluster, namespace: str) -> list[Ownership]:
    return ownership_log(cluster, namespace, PODS, f"{KIND}/{SET}")


def served_as_published(cluster: DevCluster, namespace: str) -> bool:
    table = owners(cluster, namespace)
    return bool(table) and None not in table.values() and serving(log(cluster, namespace)) == table


def drain(cluster: DevCluster, namespace: str, pod: str) -> None:
    cluster.kubectl("annotate", "-n", namespace, "pod", pod, "apportion.dev/drain=true")


LIFE = 1000
"""Writes between the backup and the drain: a backup is minutes or hours old. A watch notices
the restore only if the last change it saw is more writes after the backup than the restarting
API server makes (a few dozen here): otherwise the restored store's revision is back above the
watch's version before it resumes (docs/handoff.md, the limits)."""


def lived_on(cluster: DevCluster, namespace: str) -> None:
    scratch = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"life-{i}"}}
        for i in range(LIFE)
    ]
    listed = {"apiVersion": "v1", "kind": "List", "items": scratch}
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(listed), timeout=300)


def token_holders(entries: list[Ownership]) -> dict[tuple[str, int], set[str]]:
    holders: dict[tuple[str, int], set[str]] = defaultdict(set)
    for entry in entries:
        if entry.action == "acquire" and entry.token is not None:
            holders[(entry.unit, entry.token)].add(entry.pod)
    return holders


def acks(cluster: DevCluster, namespace: str) -> dict[str, Ack]:
    key = published(cluster.kubectl, namespace, KIND, SET).set_ref.ack_annotation
    found = {}
    for pod in get(cluster.kubectl, namespace, "pods", "-l", "app=dw")["items"]:
        text = pod["metadata"].get("annotations", {}).get(key)
        if text is not None:
            found[pod["metadata"]["name"]] = Ack.from_annotation(text)
    return found


def state(cluster: DevCluster, namespace: str) -> str:
    """What a failed wait tells: the set's conditions, the pods' annotations, the events."""
    conditions = get(cluster.kubectl, namespace, "pset", SET)["status"].get("conditions")
    pods = get(cluster.kubectl, namespace, "pods", "-l", "app=dw")["items"]
    marks = {p["metadata"]["name"]: p["metadata"].get("annotations") for p in pods}
    notes = [(e["reason"], e.get("note")) for e in events(cluster.kubectl, namespace, SET)]
    return json.dumps({"conditions": conditions, "pods": marks, "events": notes})


def repairs(cluster: DevCluster, namespace: str) -> list[dict[str, Any]]:
    return [
        e for e in events(cluster.kubectl, namespace, SET) if e["reason"].startswith("Assignment")
    ]


def moved_off_then_restored(
    cluster: DevCluster,
    namespace: str,
    backup_dir: Path,
    before_restore: Callable[[], object] = lambda: None,
) -> tuple[int, float]:
    """Backup, drain dw-2 until its units are on its siblings, `before_restore`, restore.
    Returns the highest epoch any worker logged before the restore and when it was done."""
    backup = cluster.backup_etcd(backup_dir)
    lived_on(cluster, namespace)
    drain(cluster, namespace, "dw-2")
    wait_for(
        lambda: (
            "dw-2" not in owners(cluster, namespace).values()
            and served_as_published(cluster, namespace)
        ),
        90,
        "dw-2's units never moved to its siblings",
    )
    seen = max(e.epoch for e in log(cluster, namespace))
    before_restore()
    started = time.monotonic()
    cluster.restore_etcd(backup)
    print(f"restore took {time.monotonic() - started:.1f}s")
    # The restore put back a table that gives dw-2 units again, and an older reservation.
    assert "dw-2" in owners(cluster, namespace).values()
    status = get(cluster.kubectl, namespace, "pset", SET)["status"]
    assert int(status["reservedEpoch"]) < seen
    return seen, time.monotonic()


def judged_safe(cluster: DevCluster, namespace: str, seen: int) -> dict[str, Any]:
    entries = log(cluster, namespace)
    assert overlaps(entries) == []
    shared = {key: pods for key, pods in token_holders(entries).items() if len(pods) > 1}
    assert not shared, f"tokens acquired by two pods: {shared}"
    table = published(cluster.kubectl, namespace, KIND, SET)
    assert table.epoch > seen
    reasons = [e["reason"] for e in events(cluster.kubectl, namespace, SET)]
    assert "HandoffTimedOut" not in reasons
    return {"epoch_seen_before": seen, "epoch_now": table.epoch}


def test_an_operator_running_through_a_restore_republishes_and_moves_on_at_once(
    cluster: DevCluster, namespace: str, tmp_path: Path
) -> None:
    operator = start_operator(cluster, namespace, tmp_path)
    try:
        placed(cluster, namespace)
        seen, restored = moved_off_then_restored(cluster, namespace, tmp_path / "backup")

        # The drain mark went with the restore: dw-2 takes units again, through hand-offs.
        def back_on_dw2() -> bool:
            table = read_table(cluster.kubectl, namespace, KIND, SET)
            return (
                table is not None
                and table.epoch > seen  # not the restored table, which gives dw-2 units too
                and "dw-2" in table.owners().values()
                and not table.releasing()
                and served_as_published(cluster, namespace)
            )

        wait_for(
            back_on_dw2,
            HANDOFF_TIMEOUT - 5,
            lambda: f"not settled: {owners(cluster, namespace)} {state(cluster, namespace)}",
        )
        settled = time.monotonic() - restored
        (repair,) = [e for e in repairs(cluster, namespace) if "went back" in e["note"]]
        assert repair["reason"] == "AssignmentTableRolledBack"
        assert "republished the owners" in repair["note"], repair["note"]
        figures = judged_safe(cluster, namespace, seen)
        rewound = [
            s.value
            for s in operator.samples_of("apportion_operator_watch_restarts_total")
            if s.labels.get("reason") == "rewound"
        ]
        assert sum(rewound) > 0, "the operator's caches never noticed the restore"
        print("restore, operator running:", json.dumps({**figures, "settled_s": round(settled, 1)}))
    finally:
        assert operator.stop() == 0, operator.text()
    assert "Traceback" not in operator.text(), operator.text()


def test_an_operator_restarted_after_a_restore_learns_the_epochs_from_the_acks(
    cluster: DevCluster, namespace: str, tmp_path: Path
) -> None:
    operator = start_operator(cluster, namespace, tmp_path)
    try:
        placed(cluster, namespace)
        # Down through the restore: nothing of its memory survives.
        seen, restored = moved_off_then_restored(
            cluster, namespace, tmp_path / "backup", operator.kill
        )
    finally:
        operator.kill()
    # The workers noticed the restore and named the set in their acks, at the epoch they saw.
    wait_for(
        lambda: any(
            a.set_uid is not None and a.epoch >= seen for a in acks(cluster, namespace).values()
        ),
        30,
        lambda: f"no ack names the set: {acks(cluster, namespace)}",
    )
    operator = start_operator(cluster, namespace, tmp_path)
    try:
        wait_for(
            lambda: any(
                "a worker acknowledged epoch" in e["note"] for e in repairs(cluster, namespace)
            ),
            30,
            lambda: f"no repair from the acks: {repairs(cluster, namespace)}",
        )
        wait_for(
            lambda: served_as_published(cluster, namespace),
            HANDOFF_TIMEOUT + 60,
            lambda: f"not placed again: {owners(cluster, namespace)}",
        )
        settled = time.monotonic() - restored
        figures = judged_safe(cluster, namespace, seen)
        print(
            "restore, operator restarted:", json.dumps({**figures, "settled_s": round(settled, 1)})
        )
    finally:
        assert operator.stop() == 0, operator.text()
    assert "Traceback" not in operator.text(), operator.text()
