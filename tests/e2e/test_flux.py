"""apportion under Flux: source-controller and kustomize-controller (built from their Go modules)
apply a PartitionSet and its demo workers from a Git repository served on loopback, into a
namespace the operator (a process, as in the other e2e tests) watches, on the pod-simulator
dev-cluster.

(a) the Kustomization (`wait: true`, `prune: true`) becomes Ready; (b) a commit that scales the
workers, splits the partitions and changes the strategy is applied, the operator rebalances,
and over many Flux reconciles during and after the moves Flux corrects nothing and never
reverts the operator's writes (it owns the spec through server-side apply, the operator only
the status subresource);
(d) a spec the CRD schema rejects leaves the Kustomization Ready=False with the API server's
message and the applied objects as they were; (c) a commit that removes the set has Flux prune
it and the garbage collector its ConfigMaps, with nothing hanging on a finalizer; (e) a spec the
API server accepts and apportion cannot satisfy makes the set Stalled and Flux's health check
fail at once, the workers serving on; with the operator stopped, a commit removing the set has
it pruned, its ConfigMaps collected and the workers stop serving its units.

Figures (commit → Ready, reconciles without drift) are written to `flux-figures.json` in the
test's temporary directory and printed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.flux import Flux
from tests.support.flux import GitOps, apply_results, condition
from tests.support.gitops import ObjectWatch, balanced, managers
from tests.support.unitset import (
    Ownership,
    demo_worker,
    get,
    is_true,
    ownership_log,
    ready_pods,
    unit_set,
    workers,
)

SET = "fs"
WORKERS = "fw"
OPERATOR_MANAGER = "apportion-operator"
FLUX_MANAGER = "kustomize-controller"


@pytest.fixture(scope="module")
def flux(dev_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flux]:
    started = Flux.start(dev_cluster, tmp_path_factory.mktemp("flux"))
    try:
        yield started
    finally:
        started.stop()
        assert not any(started.running().values())


def manifests(
    replicas: int, partitions: int | None, strategy: str = "Balanced"
) -> dict[str, list[dict[str, Any]]]:
    files = {"workers.yaml": [workers(WORKERS, replicas, command=demo_worker("PartitionSet", SET))]}
    if partitions is not None:
        spec = {
            "partitions": partitions,
            "keyScheme": "apportion",
            "workloadRef": {"kind": "StatefulSet", "name": WORKERS},
            "strategy": {"name": strategy},
            "rebalance": {"interval": "1s", "handoffTimeout": "60s", "maxMovesPerRound": "100%"},
        }
        files["partitionset.yaml"] = [unit_set("PartitionSet", SET, spec)]
    return files


@pytest.fixture
def gitops(operator, flux, git_server, namespace, kubectl, wait_for, tmp_path):
    """(a) 3 demo workers and a PartitionSet of 16 over them, applied by Flux from Git."""
    ops = GitOps(flux, git_server, namespace)
    sha = ops.commit(manifests(3, 16), "3 workers, 16 partitions")
    started = time.monotonic()
    ops.install()
    ops.wait_ready(sha, wait_for, 120)
    first_ready = time.monotonic() - started
    assert len(ready_pods(kubectl, namespace, f"app={WORKERS}")) == 3
    # Ready only once the set was Current: every unit placed (a count that never drops after).
    assert get(kubectl, namespace, "pset", SET)["status"]["assignedUnits"] == 16
    wait_for(lambda: balanced(kubectl, namespace, SET, 3), 90, "Balanced over 3 workers")
    ops.figures = {"install_to_ready_s": round(first_ready, 2)}
    yield ops
    ops.uninstall()


def report(tmp_path, figures: dict[str, Any]) -> None:
    (tmp_path / "flux-figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nflux figures: {json.dumps(figures)}")


def test_flux_applies_the_set_and_never_reverts_the_operator(
    gitops, flux, dev_cluster, namespace, kubectl, wait_for, tmp_path
) -> None:
    ns = namespace
    figures = dict(gitops.figures)

    # (a) commit → Ready at that revision, on an installed Kustomization.
    sha = gitops.commit(manifests(3, 16), "touch: same objects, new revision")
    figures["commit_to_ready_unchanged_s"] = round(gitops.wait_ready(sha, wait_for), 2)
    log_mark = len(apply_results(flux.log("kustomize-controller"), ns))

    # (b) scale the workers 3 → 4 and split 16 → 32 partitions in one commit.
    before = get(kubectl, ns, "pset", SET)
    epochs = [before["status"]["epoch"]]
    watch = ObjectWatch(dev_cluster, ns, "pset", SET, tmp_path / "watch.json")
    sha = gitops.commit(manifests(4, 32, "LeastShards"), "4 workers, 32 partitions, LeastShards")
    started = time.monotonic()
    ready_s = None
    ready_mark = 0
    drift_checks = 0
    deadline = started + 120
    settled_at = None
    while time.monotonic() < deadline:
        obj = get(kubectl, ns, "pset", SET)
        epochs.append(obj["status"]["epoch"])
        if ready_s is None and gitops.ready_at(sha):
            ready_s = time.monotonic() - started
            ready_mark = len(apply_results(flux.log("kustomize-controller"), ns))
        if settled_at is None and ready_s is not None and balanced(kubectl, ns, SET, 4):
            settled_at = time.monotonic()
        # Flux reconciles every 5 s anyway; ask for more during and after the moves.
        gitops.reconcile()
        drift_checks += 1
        if settled_at is not None and time.monotonic() - settled_at > 20:
            break
        time.sleep(1.0)
    assert ready_s is not None, json.dumps(gitops.kustomization().get("status"))
    assert settled_at is not None, json.dumps(get(kubectl, ns, "pset", SET).get("status"))
    figures["commit_to_ready_scale_s"] = round(ready_s, 2)
    figures["commit_to_balanced_s"] = round(settled_at - started, 2)

    obj = get(kubectl, ns, "pset", SET)
    assert obj["spec"]["partitions"] == 32
    assert obj["status"]["assignedUnits"] == 32
    assert obj["spec"]["strategy"]["name"] == "LeastShards"
    assert epochs == sorted(epochs), f"status.epoch went back: {epochs}"
    assert epochs[-1] > epochs[0]
    # Every version of the set the API server had meanwhile (a watch): the epoch never went
    # back, the new spec was never reverted once applied.
    versions = watch.stop()
    seen_epochs = [v.get("status", {}).get("epoch", 0) for v in versions]
    assert seen_epochs == sorted(seen_epochs), f"status.epoch went back: {seen_epochs}"
    partitions = [v["spec"]["partitions"] for v in versions]
    assert partitions == sorted(partitions), partitions
    assert partitions[-1] == 32, partitions
    figures["set_versions_watched"] = len(versions)
    figures["epochs"] = sorted(set(seen_epochs))

    # Field ownership: Flux applies the spec, the operator writes only status.
    obj = get(kubectl, ns, "pset", SET, "--show-managed-fields")
    owned = managers(obj)
    figures["managed_fields"] = [[*m[:3], ",".join(m[3])] for m in owned]
    flux_entries = [m for m in owned if m[0] == FLUX_MANAGER]
    operator_entries = [m for m in owned if m[0] == OPERATOR_MANAGER]
    assert flux_entries, owned
    assert all(m[1] == "Apply" and m[2] == "" for m in flux_entries), owned
    assert operator_entries, owned
    assert all(m[2] == "status" for m in operator_entries), owned
    flux_fields = json.dumps(
        [e for e in obj["metadata"]["managedFields"] if e["manager"] == FLUX_MANAGER]
    )
    assert '"f:status"' not in flux_fields, flux_fields

    # The commit's own apply configured the StatefulSet and the set; every apply after it (drift
    # detection during and after the moves) found every object "unchanged".
    results = apply_results(flux.log("kustomize-controller"), ns)
    applied, after = results[log_mark:ready_mark], results[ready_mark:]
    assert any("configured" in r.values() for r in applied), applied
    changed = [r for r in after if set(r.values()) != {"unchanged"}]
    assert not changed, changed
    figures["flux_applies_of_the_commit"] = applied
    figures["flux_applies_without_changes"] = len(after)
    figures["drift_check_triggers"] = drift_checks
    assert figures["flux_applies_without_changes"] >= 5, figures
    # The drift check just triggered may still be running (Ready=Unknown meanwhile): the
    # Kustomization must come back Ready at the same revision.
    gitops.wait_ready(sha, wait_for, 60)
    report(tmp_path, figures)


def test_flux_reports_a_rejected_spec_then_prunes_the_set(
    gitops, flux, dev_cluster, namespace, kubectl, wait_for, tmp_path
) -> None:
    ns = namespace
    figures = dict(gitops.figures)
    obj = get(kubectl, ns, "pset", SET)
    uid, generation = obj["metadata"]["uid"], obj["metadata"]["generation"]

    # (d) partitions: 0 is rejected by the CRD schema: Ready=False with the server's message,
    # and the applied objects stay as they were.
    sha = gitops.commit(manifests(3, 0), "invalid: 0 partitions")
    started = time.monotonic()

    def failed():
        k = gitops.kustomization()
        ready = condition(k, "Ready")
        return (
            k
            if ready.get("status") == "False" and "partitions" in ready.get("message", "")
            else None
        )

    rejected = wait_for(
        failed,
        120,
        lambda: f"the Kustomization never reported the rejected spec: {gitops.kustomization()}",
    )
    figures["commit_to_rejected_s"] = round(time.monotonic() - started, 2)
    message = condition(rejected, "Ready")["message"]
    figures["rejected_message"] = message
    assert "spec.partitions" in message, message
    assert "greater than or equal to 1" in message, message
    assert not rejected["status"].get("lastAppliedRevision", "").endswith(sha)
    time.sleep(5)  # another retry (retryInterval 2s): still rejected, nothing changed
    obj = get(kubectl, ns, "pset", SET)
    assert obj["metadata"]["uid"] == uid
    assert obj["metadata"]["generation"] == generation
    assert obj["spec"]["partitions"] == 16
    assert is_true(obj, "Ready")
    # Between two retries Ready is False; during one kustomize-controller may show it Unknown
    # ("reconciliation in progress"). Never True, and the rejected revision never applied.
    retried = gitops.kustomization()
    assert condition(retried, "Ready")["status"] != "True", retried["status"]
    assert not retried["status"].get("lastAppliedRevision", "").endswith(sha), retried["status"]

    # A fix is applied again.
    sha = gitops.commit(manifests(3, 16), "fix: 16 partitions")
    figures["commit_to_ready_after_fix_s"] = round(gitops.wait_ready(sha, wait_for), 2)

    # (c) remove the set from Git: Flux prunes it; the garbage collector deletes its ConfigMaps
    # (owner references); no finalizer holds anything.
    configmaps = owned_configmaps(kubectl, ns, uid)
    assert configmaps, "the set has no ConfigMaps owned by it"
    assert not obj["metadata"].get("finalizers"), obj["metadata"].get("finalizers")
    sha = gitops.commit(manifests(3, None), "remove the PartitionSet")
    started = time.monotonic()
    gitops.wait_ready(sha, wait_for)
    wait_for(
        lambda: kubectl("get", "-n", ns, "pset", SET, check=False).returncode != 0,
        30,
        "the PartitionSet was not pruned",
    )
    figures["commit_to_pruned_s"] = round(time.monotonic() - started, 2)
    wait_for(
        lambda: not owned_configmaps(kubectl, ns, uid), 60, f"ConfigMaps {configmaps} left behind"
    )
    figures["commit_to_configmaps_collected_s"] = round(time.monotonic() - started, 2)
    figures["configmaps_collected"] = configmaps
    gc_log = dev_cluster.log_path("kube-controller-manager").read_text(errors="replace")
    assert "garbage" in gc_log.lower(), "kube-controller-manager's log never mentions its GC"
    inventory = gitops.kustomization()["status"]["inventory"]["entries"]
    assert not [e for e in inventory if "PartitionSet" in e["id"]], inventory
    assert len(ready_pods(kubectl, ns, f"app={WORKERS}")) == 3  # the workers stay in Git
    report(tmp_path, figures)


def owned_configmaps(kubectl, namespace: str, uid: str) -> list[str]:
    items = get(kubectl, namespace, "configmaps")["items"]
    return sorted(
        c["metadata"]["name"]
        for c in items
        if any(o["uid"] == uid for o in c["metadata"].get("ownerReferences", []))
    )


def serving(log: list[Ownership]) -> set[tuple[str, str]]:
    """(pod, unit) pairs whose last line is an acquire or a resume: served now."""
    last: dict[tuple[str, str], str] = {}
    for entry in log:
        last[(entry.pod, entry.unit)] = entry.action
    return {key for key, action in last.items() if action in ("acquire", "resume")}


def test_flux_fails_on_a_stalled_set_and_prunes_it_with_the_operator_stopped(
    gitops, operator, flux, dev_cluster, namespace, kubectl, wait_for, tmp_path
) -> None:
    ns = namespace
    figures = dict(gitops.figures)
    pods = [p["metadata"]["name"] for p in ready_pods(kubectl, ns, f"app={WORKERS}")]
    owner = f"PartitionSet/{SET}"
    served = serving(ownership_log(dev_cluster, ns, pods, owner))
    assert len(served) == 16, served
    uid = get(kubectl, ns, "pset", SET)["metadata"]["uid"]

    # (e) a spec the API server accepts and apportion cannot satisfy: a workloadRef to a
    # StatefulSet that does not exist. The set is Stalled; Flux's health check (wait: true)
    # fails on it, and the last published assignment stays: the workers keep serving.
    files = manifests(3, 16)
    files["partitionset.yaml"][0]["spec"]["workloadRef"]["name"] = "not-there"
    sha = gitops.commit(files, "workloadRef to a StatefulSet that does not exist")
    started = time.monotonic()

    def health_check_failed():
        k = gitops.kustomization()
        ready = condition(k, "Ready")
        return (
            k
            if ready.get("reason") == "HealthCheckFailed"
            and k["status"].get("lastAttemptedRevision", "").endswith(sha)
            else None
        )

    failed = wait_for(health_check_failed, 120, "Flux's health check never failed on the set")
    figures["commit_to_health_check_failed_s"] = round(time.monotonic() - started, 2)
    message = condition(failed, "Ready")["message"]
    figures["health_check_message"] = message
    # Flux names the object and kstatus' verdict; the why is on the object (fluxcd/pkg/ssa
    # WaitForSet keeps only the status, not kstatus' message).
    assert f"PartitionSet/{ns}/{SET} status: 'Failed'" in message, message
    obj = get(kubectl, ns, "pset", SET)
    stalled = condition(obj, "Stalled")
    assert stalled["status"] == "True", stalled
    assert stalled["reason"] == "WorkloadNotFound", stalled
    assert "not-there" in stalled["message"], stalled
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
    assert serving(ownership_log(dev_cluster, ns, pods, owner)) == served

    # The fix is applied again and the Kustomization is healthy.
    sha = gitops.commit(manifests(3, 16), "fix: the workers' StatefulSet")
    figures["commit_to_ready_after_fix_s"] = round(gitops.wait_ready(sha, wait_for), 2)
    assert serving(ownership_log(dev_cluster, ns, pods, owner)) == served

    # (c') the operator stopped, a commit removes the set: Flux prunes it (no finalizer waits
    # for the operator), the garbage collector deletes its ConfigMaps, and the workers, whose
    # table can no longer be confirmed, stop serving when their serving lease runs out.
    assert operator.stop() == 0, operator.text()
    configmaps = owned_configmaps(kubectl, ns, uid)
    assert configmaps, "the set has no ConfigMaps owned by it"
    sha = gitops.commit(manifests(3, None), "remove the PartitionSet, operator stopped")
    started = time.monotonic()
    gitops.wait_ready(sha, wait_for)
    assert kubectl("get", "-n", ns, "pset", SET, check=False).returncode != 0
    figures["operator_stopped_commit_to_pruned_s"] = round(time.monotonic() - started, 2)
    wait_for(
        lambda: not owned_configmaps(kubectl, ns, uid), 60, f"ConfigMaps {configmaps} left behind"
    )
    figures["operator_stopped_commit_to_configmaps_collected_s"] = round(
        time.monotonic() - started, 2
    )
    wait_for(
        lambda: not serving(ownership_log(dev_cluster, ns, pods, owner)),
        90,
        "the workers still serve units of the pruned set",
    )
    figures["operator_stopped_commit_to_workers_stopped_s"] = round(time.monotonic() - started, 2)
    assert len(ready_pods(kubectl, ns, f"app={WORKERS}")) == 3
    report(tmp_path, figures)
