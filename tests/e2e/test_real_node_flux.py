"""Flux on the real node: the operator installed from its manifests runs as pods, the demo workers
are containers from the image built here, and Flux (source-controller and kustomize-controller as
host processes against the cluster's API server, Git over loopback HTTP) applies the
PartitionSet sample from a Git repository. A commit that scales the workers and splits the
partitions is applied and rebalanced with no drift corrected and no write of the operator
reverted; a commit that removes the set has it pruned and its ConfigMaps collected.
The same checks on the pod simulator, plus a rejected spec: tests/e2e/test_flux.py."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.flux import Flux
from apportion_dev.gitserver import GitServer
from tests.support.flux import GitOps, apply_results
from tests.support.gitops import ObjectWatch, balanced, managers, sample

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "apportion-system"
SET, WORKERS = "demo", "demo-workers"


@pytest.fixture(scope="module")
def installed_operator(real_cluster: DevCluster) -> DevCluster:
    """The operator as a user installs it, from the image built here."""
    real_cluster.kubectl("apply", "-k", str(REPO_ROOT / "manifests"))
    real_cluster.kubectl(
        "rollout", "status", "-n", SYSTEM, "statefulset/apportion-operator", "--timeout=180s"
    )
    return real_cluster


@pytest.fixture(scope="module")
def real_flux(
    installed_operator: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Flux]:
    started = Flux.start(installed_operator, tmp_path_factory.mktemp("flux"))
    try:
        yield started
    finally:
        started.stop()


def get(cluster: DevCluster, namespace: str, *what: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "-n", namespace, *what, "-o", "json").stdout)


def test_flux_on_the_real_node_applies_rebalances_without_drift_and_prunes(
    installed_operator: DevCluster, real_flux: Flux, wait_for: Any, tmp_path
) -> None:
    cluster = installed_operator
    ns = f"real-flux-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=baseline")
    figures: dict[str, Any] = {}
    with GitServer(tmp_path / "git") as git:
        ops = GitOps(real_flux, git, ns)
        try:
            # (a) 4 worker containers and 32 partitions, from Git.
            sha = ops.commit(sample(4, 32), "the PartitionSet sample")
            started = time.monotonic()
            ops.install()
            ops.wait_ready(sha, wait_for, 240)
            figures["install_to_ready_s"] = round(time.monotonic() - started, 2)
            wait_for(lambda: balanced(cluster.kubectl, ns, SET, 4), 180, "Balanced over 4 workers")

            # (b) 5 workers and 64 partitions in one commit.
            mark = len(apply_results(real_flux.log("kustomize-controller"), ns))
            watch = ObjectWatch(cluster, ns, "pset", SET, tmp_path / "watch.json")
            sha = ops.commit(sample(5, 64), "5 workers, 64 partitions")
            started = time.monotonic()
            ready_mark, ready_s, settled_at = None, None, None
            while time.monotonic() - started < 240:
                if ready_s is None and ops.ready_at(sha):
                    ready_s = time.monotonic() - started
                    ready_mark = len(apply_results(real_flux.log("kustomize-controller"), ns))
                if (
                    settled_at is None
                    and ready_s is not None
                    and balanced(cluster.kubectl, ns, SET, 5)
                ):
                    settled_at = time.monotonic()
                ops.reconcile()
                if settled_at is not None and time.monotonic() - settled_at > 20:
                    break
                time.sleep(1.0)
            assert ready_s is not None, ops.kustomization()["status"]
            assert settled_at is not None, ops.kustomization()["status"]
            figures["commit_to_ready_scale_s"] = round(ready_s, 2)
            figures["commit_to_balanced_s"] = round(settled_at - started, 2)
            versions = watch.stop()
            epochs = [v.get("status", {}).get("epoch", 0) for v in versions]
            assert epochs == sorted(epochs), epochs
            assert epochs[-1] > epochs[0], epochs
            partitions = [v["spec"]["partitions"] for v in versions]
            assert partitions == sorted(partitions), partitions
            assert partitions[-1] == 64, partitions
            figures["set_versions_watched"] = len(versions)
            obj = get(cluster, ns, "pset", SET, "--show-managed-fields")
            owned = managers(obj)
            figures["managed_fields"] = [[*m[:3], ",".join(m[3])] for m in owned]
            assert {(m[0], m[2]) for m in owned} == {
                ("kustomize-controller", ""),
                ("apportion-operator", "status"),
            }, owned
            results = apply_results(real_flux.log("kustomize-controller"), ns)
            assert any("configured" in r.values() for r in results[mark:ready_mark])
            after = results[ready_mark:]
            assert all(set(r.values()) == {"unchanged"} for r in after), after
            figures["flux_applies_without_changes"] = len(after)

            # (c) remove the set: pruned, its ConfigMaps collected, no finalizer.
            uid = obj["metadata"]["uid"]
            assert not obj["metadata"].get("finalizers")
            sha = ops.commit(sample(5, None), "remove the PartitionSet")
            started = time.monotonic()
            ops.wait_ready(sha, wait_for, 120)

            def owned_configmaps() -> list[str]:
                return [
                    c["metadata"]["name"]
                    for c in get(cluster, ns, "configmaps")["items"]
                    if any(o["uid"] == uid for o in c["metadata"].get("ownerReferences", []))
                ]

            wait_for(
                lambda: (
                    cluster.kubectl("get", "-n", ns, "pset", SET, check=False).returncode
                    and not owned_configmaps()
                ),
                60,
                "the set or its ConfigMaps are left",
            )
            figures["commit_to_pruned_and_collected_s"] = round(time.monotonic() - started, 2)
        finally:
            print(f"\nreal-node flux figures: {json.dumps(figures)}")
            ops.kubectl(
                "delete", "-n", ns, "kustomization,gitrepository", "app", "--timeout=90s",
                check=False,
            )  # fmt: skip
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
