"""manifests/ on the dev-cluster: the kustomize base passes a server-side dry run, the operator's
ClusterRole is enough to run it (it runs here as that ServiceAccount, with peering, under
operator-policy.yaml), the worker role grants what workers need and nothing more, every pod we
ship meets the restricted Pod Security Standard, and the samples are valid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    for name in ("rbac.yaml", "worker-rbac.yaml", "operator-policy.yaml"):
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
        "validatingadmissionpolicy.admissionregistration.k8s.io/apportion-operator-writes",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/apportion-operator-writes",
    } <= applied
    assert all(line.endswith("(server dry run)") for line in result.stdout.splitlines())
    assert "Warning" not in result.stderr, result.stderr


def workload_pods(text: str) -> list[dict[str, Any]]:
    """Each workload's pod template as a bare Pod: Pod Security admission enforces on Pods
    (on workloads it only warns), and a server-side dry run needs no node."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"psa-{doc['metadata']['name']}"},
            "spec": doc["spec"]["template"]["spec"],
        }
        for doc in yaml.safe_load_all(text)
        if doc and doc["kind"] in ("StatefulSet", "Deployment")
    ]


def restricted_namespace(dev_cluster, namespace: str) -> str:
    dev_cluster.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    return namespace


def dry_run_pod(dev_cluster, namespace: str, pod: dict[str, Any]) -> subprocess.CompletedProcess:
    """A server-side dry run of `pod` in `namespace`, its ServiceAccount created first."""
    account = pod["spec"].get("serviceAccountName", "default")
    found = dev_cluster.kubectl("get", "serviceaccount", account, "-n", namespace, check=False)
    if found.returncode != 0:
        dev_cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    return dev_cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod),
        check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "source",
    ["kustomize", *sorted(p.name for p in (MANIFESTS / "samples").glob("*.yaml"))],
)
def test_every_pod_we_ship_meets_the_restricted_pod_security_standard(
    dev_cluster, installed, namespace, source: str
) -> None:
    """The operator's pods and every sample workload's, admitted into a namespace that enforces
    `restricted` (the chart's: tests/e2e/test_helm_chart.py)."""
    text = (
        dev_cluster.kubectl("kustomize", str(MANIFESTS)).stdout
        if source == "kustomize"
        else (MANIFESTS / "samples" / source).read_text()
    )
    pods = workload_pods(text)
    assert pods, source
    ns = restricted_namespace(dev_cluster, namespace)
    for pod in pods:
        result = dry_run_pod(dev_cluster, ns, pod)
        assert result.returncode == 0, result.stderr
        assert "Warning" not in result.stderr, result.stderr


def test_the_restricted_check_refuses_a_pod_that_runs_as_root(
    dev_cluster, installed, namespace
) -> None:
    """The check above can fail: the first sample without its securityContext is refused."""
    (pod, *_) = workload_pods((MANIFESTS / "samples" / "partitionset-demo.yaml").read_text())
    del pod["spec"]["securityContext"]
    result = dry_run_pod(dev_cluster, restricted_namespace(dev_cluster, namespace), pod)
    assert result.returncode != 0
    assert "restricted" in result.stderr, result.stderr


def test_the_namespaced_component_binds_the_operator_in_its_namespaces_only(
    dev_cluster, installed, namespace, tmp_path
) -> None:
    """manifests/components/namespaced from a kustomization of the user's own: no cluster-wide
    binding of the operator's role, a RoleBinding in the watched namespace, cluster-wide only the
    reads of namespaces and CRDs; the API server accepts it."""
    mine = tmp_path / "mine"
    mine.mkdir()
    relative = Path(os.path.relpath(MANIFESTS, mine))
    (mine / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [str(relative)],
                "components": [str(relative / "components" / "namespaced")],
            }
        )
    )
    rendered = dev_cluster.kubectl("kustomize", str(mine)).stdout.replace("team-a", namespace)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) for d in docs}
    assert ("ClusterRoleBinding", "apportion-operator", "") not in kinds
    assert ("RoleBinding", "apportion-operator", namespace) in kinds
    (cluster_role,) = [d for d in docs if d["metadata"]["name"] == "apportion-operator-cluster"
                       and d["kind"] == "ClusterRole"]  # fmt: skip
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {
        "namespaces",
        "customresourcedefinitions",
    }
    (statefulset,) = [d for d in docs if d["kind"] == "StatefulSet"]
    args = statefulset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={namespace}" in args
    assert "--all-namespaces" not in args
    result = dev_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    assert all(line.endswith("(server dry run)") for line in result.stdout.splitlines())


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
        ("act", "operators.apportion.dev"),  # what puts it under operator-policy.yaml
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
