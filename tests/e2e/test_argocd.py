"""apportion under Argo CD: Argo CD v3.2.x's repo-server, application-controller and
applicationset-controller (built from its Go module) with Redis, as host processes, sync the
PartitionSet sample from a Git repository served on loopback into a namespace the operator (a
process, as in the other e2e tests) watches, on the pod-simulator dev-cluster. Argo CD is
configured as a user configures it: its install's argocd-cm with apportion's health checks
patched in (manifests/argocd/argocd-cm-patch.yaml); the Application and ApplicationSet are the
shipped manifests/argocd/application.yaml and applicationset.yaml with the repository and the
namespace filled in, so none has an `ignoreDifferences`.

(a) the Application syncs the sample and turns Synced and Healthy once the set is Balanced,
its health from apportion's script; (b) a commit that scales the workers is synced, the set
reads Progressing while the operator moves units to the new pod and Healthy once Balanced,
and over a comparison a second meanwhile Argo CD never finds the Application OutOfSync nor syncs
again; (c) a strategy the operator rejects reads Degraded; (d) a commit removing the set has it
pruned and its ConfigMaps collected, and deleting the Application (resources finalizer) deletes
the rest, nothing left hanging on a finalizer; (e) the ApplicationSet makes the Application of
a directory, which syncs and goes with it.

Figures (commit → synced, → Balanced, comparisons without drift) are printed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.argocd import NAMESPACE, ArgoCD
from tests.support.argocd import (
    ArgoApp,
    health_status,
    resource,
    shipped,
    sync_status,
    synced_at,
)
from tests.support.gitops import ObjectWatch, balanced, commit_deploy, managers, sample
from tests.support.unitset import WORKER_ACCOUNT, condition, get, ready_pods

SET, WORKERS = "demo", "demo-workers"
MANAGED = {"ServiceAccount", "RoleBinding", "StatefulSet", "PartitionSet"}


@pytest.fixture(scope="module")
def argocd(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArgoCD]:
    started = ArgoCD.start(dev_cluster, tmp_path_factory.mktemp("argocd"))
    try:
        yield started
    finally:
        started.stop()
        assert not any(started.running().values())
        left = dev_cluster.kubectl(
            "get", "-n", NAMESPACE, "applications,applicationsets", "-o", "name"
        ).stdout
        assert not left, left


@pytest.fixture
def app(operator, argocd, git_server, namespace, kubectl, wait_for) -> Iterator[ArgoApp]:
    """(a) the sample with 3 workers and 16 partitions, synced by the shipped Application."""
    ops = ArgoApp(argocd, git_server, namespace)
    sha = ops.commit(deploy(3, 16), "3 workers, 16 partitions")
    started = time.monotonic()
    ops.install()
    healthy = ops.wait(sha, "Healthy", wait_for, 180)
    ops.figures["install_to_healthy_s"] = round(time.monotonic() - started, 2)
    # Healthy only once the set was: every unit placed, nothing moving (Reconciling=False).
    assert balanced(kubectl, namespace, SET, 3), get(kubectl, namespace, "pset", SET)["status"]
    assert len(ready_pods(kubectl, namespace, f"app={WORKERS}")) == 3
    set_health = resource(healthy, "PartitionSet", SET).get("health")
    ready = condition(get(kubectl, namespace, "pset", SET), "Ready")
    # the message is the shipped script's (rule 4: Ready's reason and message)
    assert set_health == {"status": "Healthy", "message": f"{ready['reason']}: {ready['message']}"}
    yield ops
    ops.delete()


def deploy(replicas: int, partitions: int | None) -> dict[str, list[dict[str, Any]]]:
    """The sample with workers that report a load of 1 per partition (the sample's come from
    the requests its traffic demo sends; with none, Balanced has nothing to weigh and moves
    nothing) and take 2 s to release a partition, as a worker draining its requests does, so a
    rebalance's hand-offs span several of the operator's status writes."""
    files = sample(replicas, partitions)
    workers = next(o for o in files["app.yaml"] if o["kind"] == "StatefulSet")
    command = workers["spec"]["template"]["spec"]["containers"][0]["command"]
    command[command.index("--load-profile") + 1] = "uniform"
    command += ["--release-delay", "2"]
    return files


def report(figures: dict[str, Any]) -> None:
    print(f"\nargocd figures: {json.dumps(figures)}")


def test_argocd_syncs_and_follows_a_rebalance_without_drift(
    app, argocd, dev_cluster, namespace, kubectl, wait_for, tmp_path
) -> None:
    figures = dict(app.figures)
    first = app.get()
    assert {r["kind"] for r in first["status"]["resources"]} == MANAGED, first["status"]
    history = len(first["status"]["history"])

    # (b) scale the workers 3 → 4: the set's spec stays, the operator moves units to the new
    # pod in rounds (Reconciling=True). Every version of the Application meanwhile is watched.
    watch = ObjectWatch(dev_cluster, NAMESPACE, "application", app.name, tmp_path / "app.json")
    set_watch = ObjectWatch(dev_cluster, namespace, "pset", SET, tmp_path / "set.json")
    sha = app.commit(deploy(4, 16), "4 workers")
    started = time.monotonic()
    synced_s = settled_s = None
    while time.monotonic() - started < 180:
        current = app.get()
        if synced_s is None and synced_at(current, sha):
            synced_s = time.monotonic() - started
        if not (
            synced_s is not None
            and health_status(current) == "Healthy"
            and balanced(kubectl, namespace, SET, 4)
        ):
            settled_s = None
        elif settled_s is None:
            settled_s = time.monotonic() - started
        # a comparison with Git every second, during and after the moves
        argocd.refresh(app.name)
        # until it stayed settled for 15 s
        if settled_s is not None and time.monotonic() - started > settled_s + 15:
            break
        time.sleep(1.0)
    versions = watch.stop()
    # the operator's writes stood: the table's epoch only grew, over the moves
    epochs = [v.get("status", {}).get("epoch", 0) for v in set_watch.stop()]
    assert epochs == sorted(epochs), epochs
    assert epochs[-1] > epochs[0], epochs
    assert synced_s is not None, json.dumps(app.get()["status"])
    assert settled_s is not None, json.dumps(app.get()["status"])
    figures["commit_to_synced_s"] = round(synced_s, 2)
    figures["commit_to_healthy_and_balanced_s"] = round(settled_s, 2)

    after = versions[next(i for i, v in enumerate(versions) if synced_at(v, sha)) :]
    out_of_sync = [
        v["status"]
        for v in after
        if sync_status(v) != "Synced"
        or any(r.get("status") != "Synced" for r in v["status"].get("resources", []))
    ]
    assert not out_of_sync, json.dumps(out_of_sync[0])
    compared = {v["status"].get("reconciledAt") for v in after}
    figures["comparisons_without_drift"] = len(compared)
    assert len(compared) >= 5, compared
    final = app.get()
    # one sync for the commit, none after it: selfHeal found nothing to correct
    assert len(final["status"]["history"]) == history + 1, final["status"]["history"]
    assert final["status"]["history"][-1]["revision"] == sha
    # the operator's ConfigMaps are the set's, not the Application's
    assert {r["kind"] for r in final["status"]["resources"]} == MANAGED, final["status"]

    # Field ownership: the operator writes only status, Argo CD's apply never status.
    owned = managers(get(kubectl, namespace, "pset", SET, "--show-managed-fields"))
    figures["managed_fields"] = [[*m[:3], ",".join(m[3])] for m in owned]
    operator = [m for m in owned if m[0] == "apportion-operator"]
    assert operator, owned
    assert all(m[2] == "status" for m in operator), owned
    assert all("f:status" not in m[3] for m in owned if m not in operator), owned

    # The set's health through the shipped script: Progressing while it rebalanced, then
    # Healthy, never anything else.
    healths = [resource(v, "PartitionSet", SET).get("health", {}) for v in after]
    statuses = [h.get("status") for h in healths]
    figures["set_health"] = [s for i, s in enumerate(statuses) if i == 0 or s != statuses[i - 1]]
    figures["progressing_messages"] = sorted(
        {h["message"] for h in healths if h.get("status") == "Progressing"}
    )
    assert set(statuses) == {"Progressing", "Healthy"}, figures["set_health"]
    # rule 3 of the script: the operator's Reconciling (the spec's generation did not change)
    assert any(m.startswith("HandoffInProgress: ") for m in figures["progressing_messages"])
    assert statuses[-1] == "Healthy"
    assert health_status(final) == "Healthy"
    report(figures)


def test_argocd_reads_degraded_for_a_strategy_the_operator_rejects(
    app, namespace, kubectl, wait_for
) -> None:
    files = deploy(3, 16)
    pset = next(o for o in files["app.yaml"] if o["kind"] == "PartitionSet")
    # The CRD accepts any entry point; the operator finds none of that name: Stalled.
    pset["spec"]["strategy"] = {"name": "Custom", "custom": {"entryPoint": "no-such-strategy"}}
    sha = app.commit(files, "a strategy that is not installed")
    degraded = app.wait(sha, "Degraded", wait_for)
    stalled = condition(get(kubectl, namespace, "pset", SET), "Stalled")
    assert stalled["status"] == "True", stalled
    set_health = resource(degraded, "PartitionSet", SET)["health"]
    assert set_health == {
        "status": "Degraded",
        "message": f"{stalled['reason']}: {stalled['message']}",
    }
    assert "no-such-strategy" in set_health["message"], set_health

    sha = app.commit(deploy(3, 16), "the default strategy again")
    app.wait(sha, "Healthy", wait_for)


def test_argocd_prunes_the_set_and_deletes_everything_with_the_application(
    app, argocd, namespace, kubectl, wait_for
) -> None:
    uid = get(kubectl, namespace, "pset", SET)["metadata"]["uid"]
    assert owned_configmaps(kubectl, namespace, uid), "the set has no ConfigMaps"

    # (d) remove the set from Git: pruned, its ConfigMaps collected by the garbage collector.
    sha = app.commit(deploy(3, None), "remove the PartitionSet")
    synced = app.wait(sha, "Healthy", wait_for)
    assert {r["kind"] for r in synced["status"]["resources"]} == MANAGED - {"PartitionSet"}
    wait_for(
        lambda: kubectl("get", "-n", namespace, "pset", SET, check=False).returncode != 0,
        30,
        "the PartitionSet was not pruned",
    )
    wait_for(lambda: not owned_configmaps(kubectl, namespace, uid), 60, "its ConfigMaps are left")

    # Delete the Application: its finalizer has Argo CD delete what it applied, then go.
    app.delete()
    assert kubectl("get", "-n", NAMESPACE, "application", app.name, check=False).returncode != 0
    wait_for(lambda: not leftovers(kubectl, namespace), 60, lambda: leftovers(kubectl, namespace))


def test_the_applicationset_makes_the_application_of_a_directory(
    operator, argocd, git_server, namespace, kubectl, wait_for
) -> None:
    """(e) the shipped ApplicationSet: a directory `namespaces/<namespace>` with the sample
    becomes an Application of that name syncing it there; it goes with the ApplicationSet."""
    repo = git_server.create(f"{namespace}-namespaces")
    sha = commit_deploy(repo, deploy(3, 16), "the sample", path=f"namespaces/{namespace}")
    appset = shipped("applicationset.yaml")
    appset["metadata"]["name"] = namespace
    appset["spec"]["generators"][0]["git"]["repoURL"] = git_server.url(f"{namespace}-namespaces")
    appset["spec"]["template"]["spec"]["source"]["repoURL"] = git_server.url(
        f"{namespace}-namespaces"
    )
    kubectl("apply", "-f", "-", input=json.dumps(appset))
    try:

        def healthy() -> dict[str, Any] | None:
            found = kubectl("get", "-n", NAMESPACE, "application", namespace, check=False)
            if found.returncode != 0:
                return None
            current = argocd.application(namespace)
            return (
                current if synced_at(current, sha) and health_status(current) == "Healthy" else None
            )

        generated = wait_for(healthy, 180, lambda: json.dumps(appset_status(kubectl, namespace)))
        assert generated["spec"]["destination"]["namespace"] == namespace
        assert generated["spec"]["source"]["path"] == f"namespaces/{namespace}"
        assert balanced(kubectl, namespace, SET, 3)
    finally:
        kubectl("delete", "-n", NAMESPACE, "applicationset", namespace, "--timeout=60s")
    wait_for(
        lambda: kubectl("get", "-n", NAMESPACE, "application", namespace, check=False).returncode,
        120,
        "the generated Application is left",
    )
    wait_for(lambda: not leftovers(kubectl, namespace), 60, lambda: leftovers(kubectl, namespace))


def appset_status(kubectl, namespace: str) -> Any:
    found = kubectl("get", "-n", NAMESPACE, "applicationset", namespace, "-o", "json")
    return json.loads(found.stdout).get("status")


def owned_configmaps(kubectl, namespace: str, uid: str) -> list[str]:
    return sorted(
        c["metadata"]["name"]
        for c in get(kubectl, namespace, "configmaps")["items"]
        if any(o["uid"] == uid for o in c["metadata"].get("ownerReferences", []))
    )


def leftovers(kubectl, namespace: str) -> list[str]:
    """What is in `namespace`, Terminating or not, besides what the namespace came with and what
    the `namespace` fixture made (the e2e workers' account)."""
    kinds = "statefulsets,pods,partitionsets,serviceaccounts,rolebindings,configmaps"
    ours = {"default", "kube-root-ca.crt", WORKER_ACCOUNT}
    return sorted(
        f"{o['kind']}/{o['metadata']['name']}"
        for o in get(kubectl, namespace, kinds)["items"]
        if o["metadata"]["name"] not in ours
    )
