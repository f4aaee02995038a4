"""Least privilege for workers, enforced by the real API server (issue 21): with the
apportion-worker role and the ValidatingAdmissionPolicy of manifests/worker-policy.yaml, a
worker's token bound to its Pod (`kubectl create token --bound-object-kind Pod`, as a kubelet's
is) may write its own Pod's ack annotations and apportion's unit-state Leases held in its own
name, and nothing else: each refusal names the policy and what is allowed. Tokens the pod
simulator gives to process pods are exercised by every worker e2e test (they all run under this
policy, tests.support.unitset.grant_worker_role), the real kubelet's by test_real_node_workloads."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from tests.support.tokens import as_user
from tests.support.unitset import WORKER_ACCOUNT

POLICY = "apportion-worker-writes"
ACK = "apportion.dev/ack.shardset.carts"
UNIT_LEASE = "carts-shardset-unit-4-1"


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "carts"}},
        "spec": {
            "serviceAccountName": WORKER_ACCOUNT,
            "automountServiceAccountToken": False,
            "containers": [{"name": "worker", "image": "example.invalid/worker:1"}],
        },
    }


def lease(name: str, holder: str, labels: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "labels": labels},
            "spec": {"holderIdentity": holder},
        }
    )


UNIT_LABELS = {"apportion.dev/set": "shardset.carts"}


@pytest.fixture
def world(
    dev_cluster: DevCluster, namespace: str, tmp_path: Path, wait_for
) -> Iterator[dict[str, Any]]:
    """Pods a and b under the worker account, another application's leader-election Lease and
    a unit-state Lease; kubectl as pod a's worker (bound token), as the worker account with a
    plain token, and as a ServiceAccount that is both a worker and a cluster admin."""
    kubectl = dev_cluster.kubectl
    for name in ("a", "b"):
        kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod(name)))
    uid = kubectl("get", "pod", "a", "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout
    kubectl("apply", "-n", namespace, "-f", "-", input=lease("other-app-lock", "x", {}))
    kubectl("apply", "-n", namespace, "-f", "-", input=lease(UNIT_LEASE, "b", UNIT_LABELS))
    bound = kubectl(
        "create", "token", WORKER_ACCOUNT, "-n", namespace,
        "--bound-object-kind", "Pod", "--bound-object-name", "a", "--bound-object-uid", uid,
    ).stdout.strip()  # fmt: skip
    plain = kubectl("create", "token", WORKER_ACCOUNT, "-n", namespace).stdout.strip()
    kubectl("create", "serviceaccount", "gitops", "-n", namespace)
    kubectl(
        "create", "rolebinding", "gitops-worker", "-n", namespace,
        "--clusterrole=apportion-worker", f"--serviceaccount={namespace}:gitops",
    )  # fmt: skip
    kubectl(
        "create", "clusterrolebinding", f"gitops-admin-{namespace}",
        "--clusterrole=cluster-admin", f"--serviceaccount={namespace}:gitops",
    )  # fmt: skip
    admin_sa = kubectl("create", "token", "gitops", "-n", namespace).stdout.strip()
    worker = as_user(dev_cluster, tmp_path / "a.kubeconfig", namespace, bound)
    # A new policy takes a moment to be enforced: wait until a forged ack is refused.
    wait_for(
        lambda: worker("annotate", "pod", "b", f"{ACK}=probe").returncode != 0,
        timeout=30,
        message="the worker policy is not enforced",
    )
    kubectl("annotate", "pod", "b", f"{ACK}-", check=False)
    yield {
        "worker": worker,
        "plain": as_user(dev_cluster, tmp_path / "plain.kubeconfig", namespace, plain),
        "admin_sa": as_user(dev_cluster, tmp_path / "gitops.kubeconfig", namespace, admin_sa),
        "namespace": namespace,
    }
    kubectl("delete", "clusterrolebinding", f"gitops-admin-{namespace}", check=False)


def refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode != 0, f"allowed: {result.stdout}"
    for word in words:
        assert word in result.stderr, result.stderr


def test_a_worker_writes_its_own_ack_and_its_unit_state(dev_cluster, world) -> None:
    worker, ns = world["worker"], world["namespace"]
    ack = json.dumps({"uid": "u", "epoch": 3})
    assert worker("annotate", "pod", "a", f"{ACK}={ack}", "--overwrite").returncode == 0
    got = dev_cluster.kubectl("get", "pod", "a", "-n", ns, "-o", "json").stdout
    assert json.loads(got)["metadata"]["annotations"][ACK] == ack
    # Server-side apply, as apportion.worker._state_transfer writes (a new Lease needs `create`).
    mine = lease("carts-shardset-unit-4-2", "a", UNIT_LABELS)
    result = worker("apply", "--server-side", "--force-conflicts", "-f", "-", input=mine)
    assert result.returncode == 0, result.stderr
    taken = lease(UNIT_LEASE, "a", UNIT_LABELS)  # a later release of the same unit, by a
    result = worker("apply", "--server-side", "--force-conflicts", "-f", "-", input=taken)
    assert result.returncode == 0, result.stderr
    assert worker("get", "lease", UNIT_LEASE, "-o", "name").returncode == 0


@pytest.mark.parametrize(
    ("what", "args", "words"),
    [
        ("another pod's ack", ("annotate", "pod", "b", f"{ACK}=x"), ("only its own Pod, a",)),
        (
            "relabel its own pod",
            ("label", "pod", "a", "app=other", "--overwrite"),
            ("apportion.dev/ack.*",),
        ),
        (
            "relabel another pod",
            ("label", "pod", "b", "app=other", "--overwrite"),
            ("only its own Pod",),
        ),
        (
            "another pod's deletion cost",
            ("annotate", "pod", "b", "controller.kubernetes.io/pod-deletion-cost=-100"),
            ("only its own Pod",),
        ),
        (
            "its own deletion cost",
            ("annotate", "pod", "a", "controller.kubernetes.io/pod-deletion-cost=-100"),
            ("apportion.dev/ack.*",),
        ),
        ("an image change", ("set", "image", "pod/a", "worker=evil:1"), ("apportion.dev/ack.*",)),
        (
            "another app's lease",
            ("annotate", "lease", "other-app-lock", "taken=yes"),
            ("unit-state Leases", "other-app-lock"),
        ),
    ],
)
def test_a_worker_is_refused(world, what: str, args: tuple[str, ...], words: tuple[str, ...]):
    refused(world["worker"](*args), POLICY, *words)


def test_a_worker_cannot_write_leases_that_are_not_its_unit_state(world) -> None:
    worker = world["worker"]
    apply = ("apply", "--server-side", "--force-conflicts", "-f", "-")
    unlabelled = lease("mine-unit-4-0", "a", {})
    refused(worker(*apply, input=unlabelled), POLICY, "label apportion.dev/set")
    not_a_unit = lease("leader-lock", "a", UNIT_LABELS)
    refused(worker(*apply, input=not_a_unit), POLICY, "<set>-<kind>-unit-<count>-<unit>")
    in_b_s_name = lease(UNIT_LEASE, "b", UNIT_LABELS)
    refused(worker(*apply, input=in_b_s_name), POLICY, "held by its own Pod a")
    adopted = lease("other-app-lock", "a", UNIT_LABELS)
    refused(worker(*apply, input=adopted), POLICY)


@pytest.mark.parametrize(
    "args",
    [
        ("get", "secrets"),
        ("delete", "pod", "b", "--wait=false"),
        ("delete", "lease", UNIT_LEASE),
        ("create", "configmap", "forged-table"),
        ("get", "shardsets.apportion.dev"),
    ],
)
def test_rbac_refuses_what_no_worker_library_does(crds, world, args: tuple[str, ...]) -> None:
    result = world["worker"](*args)
    assert result.returncode != 0, result.stderr
    assert "forbidden" in result.stderr.lower(), result.stderr


def test_a_token_not_bound_to_a_pod_writes_nothing(world) -> None:
    refused(world["plain"]("annotate", "pod", "a", f"{ACK}=x"), POLICY, "names no Pod")
    unit = lease("carts-shardset-unit-4-3", "a", UNIT_LABELS)
    result = world["plain"]("apply", "--server-side", "-f", "-", input=unit)
    refused(result, POLICY, "names no Pod")


def test_admins_and_wildcard_service_accounts_are_not_workers(dev_cluster, world) -> None:
    """The policy holds principals to it by the role's `act`, unless they are granted
    everything: a GitOps controller with cluster-admin that also holds the worker role still
    manages pods and leases, and so does a person."""
    ns = world["namespace"]
    result = world["admin_sa"]("label", "pod", "b", "team=gitops")
    assert result.returncode == 0, result.stderr
    result = world["admin_sa"]("annotate", "lease", "other-app-lock", "renewed=1")
    assert result.returncode == 0, result.stderr
    dev_cluster.kubectl(
        "annotate", "pod", "a", "controller.kubernetes.io/pod-deletion-cost=5", "-n", ns
    )
