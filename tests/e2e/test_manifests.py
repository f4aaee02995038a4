"""manifests/ on the dev-cluster: the kustomize base passes a server-side dry run, the operator's
ClusterRole is enough to run it (it runs here as that ServiceAccount, with peering), the worker
role grants what workers need and nothing more, and the samples are valid."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.unitset import workers

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
SYSTEM_NAMESPACE = "apportion-system"
OPERATOR_SA = f"system:serviceaccount:{SYSTEM_NAMESPACE}:apportion-operator"


@pytest.fixture(scope="module")
def installed(dev_cluster, crds) -> None:
    """The system namespace and the RBAC applied for real (the CRDs by `crds`)."""
    dev_cluster.kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"))
    for name in ("rbac.yaml", "worker-rbac.yaml"):
        dev_cluster.kubectl("apply", "-n", SYSTEM_NAMESPACE, "-f", str(MANIFESTS / name))


def test_kustomization_passes_a_server_side_dry_run(dev_cluster, installed) -> None:
    result = dev_cluster.kubectl("apply", "-k", str(MANIFESTS), "--dry-run=server")
    applied = {line.split()[0] for line in result.stdout.splitlines()}
    assert {
        "namespace/apportion-system",
        "customresourcedefinition.apiextensions.k8s.io/partitionsets.apportion.dev",
        "customresourcedefinition.apiextensions.k8s.io/shardsets.apportion.dev",
        "customresourcedefinition.apiextensions.k8s.io/graintypes.apportion.dev",
        "role.rbac.authorization.k8s.io/apportion-operator-leader-election",
        "rolebinding.rbac.authorization.k8s.io/apportion-operator-leader-election",
        "serviceaccount/apportion-operator",
        "clusterrole.rbac.authorization.k8s.io/apportion-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/apportion-operator",
        "clusterrole.rbac.authorization.k8s.io/apportion-worker",
        "statefulset.apps/apportion-operator",
    } <= applied
    assert all(line.endswith("(server dry run)") for line in result.stdout.splitlines())
    assert "Warning" not in result.stderr, result.stderr


def test_operator_pods_meet_the_restricted_pod_security_standard(dev_cluster, installed) -> None:
    rendered = dev_cluster.kubectl("kustomize", str(MANIFESTS)).stdout
    (statefulset,) = [d for d in yaml.safe_load_all(rendered) if d["kind"] == "StatefulSet"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "psa-probe", "namespace": SYSTEM_NAMESPACE},
        "spec": statefulset["spec"]["template"]["spec"],
    }
    # The namespace enforces `restricted`; a non-compliant pod would be refused here.
    dev_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod))


def can_i(
    dev_cluster, user: str, verb: str, resource: str, namespace: str = "", object_name: str = ""
) -> bool:
    """A SubjectAccessReview: unlike `kubectl auth can-i` it needs no discovery, so it also
    answers for APIs not served right now (metrics.k8s.io)."""
    name, _, subresource = resource.partition("/")
    plural, _, group = name.partition(".")
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": plural,
                "subresource": subresource,
                "namespace": namespace,
                "name": object_name,
            },
        },
    }
    result = dev_cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(review))
    return bool(json.loads(result.stdout)["status"].get("allowed"))


@pytest.mark.parametrize(
    ("verb", "resource"),
    [
        ("patch", "partitionsets.apportion.dev/status"),
        ("watch", "graintypes.apportion.dev"),
        ("update", "shardsets.apportion.dev/finalizers"),
        ("create", "configmaps"),
        ("watch", "configmaps"),
        ("patch", "pods"),
        ("create", "events"),
        ("create", "events.events.k8s.io"),
        ("watch", "statefulsets.apps"),
        ("list", "deployments.apps"),
        ("list", "pods.metrics.k8s.io"),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
    ],
)
def test_operator_role_grants(dev_cluster, installed, verb: str, resource: str) -> None:
    assert can_i(dev_cluster, OPERATOR_SA, verb, resource)


@pytest.mark.parametrize(
    ("verb", "resource"),
    [
        ("get", "secrets"),
        ("delete", "pods"),
        ("patch", "statefulsets.apps"),
        ("delete", "partitionsets.apportion.dev"),
        # Verbs the code never uses (issue 10): no grant beyond them.
        ("update", "leases.coordination.k8s.io"),
        ("list", "controllerrevisions.apps"),
        ("patch", "configmaps"),
        ("update", "partitionsets.apportion.dev"),
        ("patch", "events"),
    ],
)
def test_operator_role_denies(dev_cluster, installed, verb: str, resource: str) -> None:
    assert not can_i(dev_cluster, OPERATOR_SA, verb, resource)


def test_operator_may_renew_its_own_lease_and_no_other(dev_cluster, installed) -> None:
    lease = "leases.coordination.k8s.io"
    assert can_i(dev_cluster, OPERATOR_SA, "update", lease, SYSTEM_NAMESPACE, "apportion-operator")
    assert can_i(dev_cluster, OPERATOR_SA, "create", lease, SYSTEM_NAMESPACE)
    assert not can_i(dev_cluster, OPERATOR_SA, "update", lease, SYSTEM_NAMESPACE, "kube-scheduler")
    assert not can_i(dev_cluster, OPERATOR_SA, "update", lease, "default", "apportion-operator")
    assert not can_i(
        dev_cluster, OPERATOR_SA, "delete", lease, SYSTEM_NAMESPACE, "apportion-operator"
    )


def test_operator_runs_as_its_service_account_with_leader_election(
    dev_cluster, installed, namespace, tmp_path
) -> None:
    token = dev_cluster.kubectl(
        "create", "token", "apportion-operator", "-n", SYSTEM_NAMESPACE, "--duration=1h"
    ).stdout.strip()
    kubeconfig = tmp_path / "operator.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [
                    {
                        "name": "dev",
                        "cluster": {
                            "server": dev_cluster.server,
                            "certificate-authority": str(dev_cluster.ca_file),
                        },
                    }
                ],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "dev", "user": "operator"}}],
            }
        )
    )
    log = tmp_path / "operator.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apportion",
                "operator",
                "--namespace",
                namespace,
                "--leader-election",
                "apportion-operator",
                "--leader-election-namespace",
                SYSTEM_NAMESPACE,
            ],
            env={**dev_cluster.env, "KUBECONFIG": str(kubeconfig), "POD_NAME": "rbac-operator"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            dev_cluster.kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                # Worker pods make the operator walk its whole path under its own account:
                # the assignment ConfigMap, status, Events and pod-deletion-cost patches.
                input=yaml.safe_dump_all(
                    [
                        workers("w", 2),
                        {
                            "apiVersion": "apportion.dev/v1alpha1",
                            "kind": "PartitionSet",
                            "metadata": {"name": "rbac"},
                            "spec": {"partitions": 4, "selector": {"matchLabels": {"app": "w"}}},
                        },
                    ]
                ),
            )
            result = dev_cluster.kubectl(
                "wait",
                "-n",
                namespace,
                "--for=condition=Ready",
                "partitionset/rbac",
                "--timeout=60s",
                check=False,
            )
            assert result.returncode == 0, f"{result.stderr}\n{log.read_text()}"
            lease = json.loads(
                dev_cluster.kubectl(
                    "get", "lease", "apportion-operator", "-n", SYSTEM_NAMESPACE, "-o", "json"
                ).stdout
            )
            assert lease["spec"]["holderIdentity"] == "rbac-operator"
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
    text = log.read_text()
    assert "403" not in text, text
    assert "Forbidden" not in text, text
    assert "Traceback" not in text, text


def sample_docs(name: str, *kinds: str) -> str:
    docs = yaml.safe_load_all((MANIFESTS / "samples" / name).read_text())
    return yaml.safe_dump_all([d for d in docs if d["kind"] in kinds])


def test_worker_role_is_minimal(dev_cluster, installed, namespace) -> None:
    dev_cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=sample_docs("partitionset-demo.yaml", "ServiceAccount", "RoleBinding"),
    )
    worker = f"system:serviceaccount:{namespace}:demo-workers"
    expectations = {
        ("watch", "configmaps", namespace): True,
        ("patch", "pods", namespace): True,
        ("patch", "leases.coordination.k8s.io", namespace): True,
        ("create", "leases.coordination.k8s.io", namespace): True,
        ("update", "leases.coordination.k8s.io", namespace): False,
        ("act", "workers.apportion.dev", namespace): True,
        ("exempt", "workers.apportion.dev", namespace): False,
        ("get", "partitionsets.apportion.dev", namespace): False,
        ("create", "configmaps", namespace): False,
        ("delete", "pods", namespace): False,
        ("patch", "partitionsets.apportion.dev", namespace): False,
        ("get", "secrets", namespace): False,
        ("get", "configmaps", "default"): False,
    }
    answers = {key: can_i(dev_cluster, worker, *key) for key in expectations}
    assert answers == expectations


@pytest.mark.parametrize("sample", ["partitionset-demo.yaml", "shardset-demo.yaml"])
def test_samples_are_valid(dev_cluster, installed, namespace, sample: str) -> None:
    result = dev_cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(MANIFESTS / "samples" / sample)
    )
    lines = result.stdout.splitlines()
    assert any(line.startswith("statefulset.apps/") for line in lines)
    assert any(".apportion.dev/" in line for line in lines)
