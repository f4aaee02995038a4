"""Least privilege for the operator, enforced by the real API server (issue 32): two teams'
operators
installed from the chart with disjoint `watchedNamespaces` (each a Role in its namespace, its own
leader-election Lease, the CRDs and the policies shared), under the ValidatingAdmissionPolicy of
manifests/operator-policy.yaml. With its own token an operator is refused every write outside
its rights (each refusal names the policy, or is RBAC's), and it still does everything
it needs: both run as processes under their tokens, place a set each, publish, patch deletion
costs, post Events and write status, and never touch the other team's set. The cluster-wide
install under the same policy runs in tests/e2e/test_manifests.py."""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from apportion.publishing.events import REPORTING_CONTROLLER
from apportion_dev.devcluster import DevCluster
from tests.support.tokens import as_user, token_kubeconfig
from tests.support.unitset import Operator, apply, get, workers

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "apportion"
POLICY = "apportion-operator-writes"
RBAC = "cannot "  # what RBAC's refusals say: User "…" cannot create resource "…"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}


@dataclass
class Team:
    name: str
    namespace: str  # where its sets live
    system: str  # where its operator runs and holds its Lease
    token: str


def partitionset(name: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "apportion.dev/v1alpha1",
        "kind": "PartitionSet",
        "metadata": {"name": name},
        "spec": {"partitions": 4, "selector": {"matchLabels": {"app": app}}},
    }


@pytest.fixture
def teams(dev_cluster: DevCluster, crds: None, helm, namespace: str) -> Iterator[list[Team]]:
    """Team a (sets in `namespace`) and team b, each an operator release of the chart in a
    namespace of its own watching only its team's namespace, rendered with
    sharedObjects.enabled=false: the shared policies are applied from manifests/, as the other
    tests' worker policy is, by the install that brings them."""
    kubectl = dev_cluster.kubectl
    kubectl("apply", "-f", str(REPO / "manifests" / "operator-policy.yaml"))
    made: list[Team] = []
    try:
        for letter in ("a", "b"):
            ns = namespace if letter == "a" else f"{namespace}-b"
            system = f"{namespace}-op{letter}"
            for created in {ns, system} - {namespace}:
                kubectl("create", "namespace", created)
            rendered = helm(
                "template", f"team-{letter}", str(CHART), "-n", system,
                "--set", f"watchedNamespaces={{{ns}}}", "--set", "sharedObjects.enabled=false",
            ).stdout  # fmt: skip
            rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in RBAC_KINDS]
            kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
            token = kubectl(
                "create", "token", "apportion-operator", "-n", system, "--duration=1h"
            ).stdout.strip()
            made.append(Team(letter, ns, system, token))
        yield made
    finally:
        for team in made:
            kubectl("delete", "clusterrole,clusterrolebinding", f"apportion-operator-{team.system}",
                    check=False)  # fmt: skip
            for gone in {team.namespace, team.system} - {namespace}:
                kubectl("delete", "namespace", gone, "--wait=false", check=False)


@dataclass
class Check:
    what: str
    args: tuple[str, ...]
    refused_by: str  # the policy's name, or RBAC
    input: str | None = None


def table(name: str, owner: dict[str, Any] | None, labels: dict[str, str]) -> str:
    """A ConfigMap as apportion publishes one: its labels and its set as controller."""
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apportion.dev/v1alpha1",
                "kind": "PartitionSet",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {}})


TABLE_LABELS = {
    "app.kubernetes.io/managed-by": "apportion",
    "apportion.dev/set-kind": "PartitionSet",
    "apportion.dev/set-name": "guarded",
    "apportion.dev/part": "root",
}


def replaced(kubectl: Callable[..., Any], ns: str, name: str, change: Callable[[Any], None]) -> str:
    """ConfigMap `name` as read by the admin, changed: for a PUT (`kubectl replace`), the write
    the operator's role allows on ConfigMaps."""
    obj = get(kubectl, ns, "configmap", name)
    change(obj)
    return json.dumps(obj)


def checks(kubectl: Callable[..., Any], team: Team, other: Team) -> list[Check]:
    ns = team.namespace
    owner = get(kubectl, ns, "partitionset", "guarded")
    ack = "apportion.dev/ack.partitionset.guarded"

    def set_data(obj: Any) -> None:
        obj["data"] = {"a": "forged"}

    def adopt(obj: Any) -> None:
        obj["metadata"]["labels"] = TABLE_LABELS
        obj["metadata"]["ownerReferences"] = json.loads(table("x", owner, {}))["metadata"][
            "ownerReferences"
        ]

    replace = ("replace", "-f", "-")
    return [
        Check("replace kube-root-ca.crt", replace, POLICY,
              replaced(kubectl, ns, "kube-root-ca.crt", set_data)),
        Check("delete kube-root-ca.crt", ("delete", "configmap", "kube-root-ca.crt"), POLICY),
        Check("a ConfigMap in kube-system",
              ("create", "configmap", "evil", "-n", "kube-system"), RBAC),
        Check("a ConfigMap in the other team's namespace",
              ("create", "configmap", "evil", "-n", other.namespace), RBAC),
        Check("an unlabelled ConfigMap", ("create", "configmap", "evil"), POLICY),
        Check("rewrite an application's ConfigMap", replace, POLICY,
              replaced(kubectl, ns, "app-config", set_data)),
        Check("adopt an application's ConfigMap as a table", replace, POLICY,
              replaced(kubectl, ns, "app-config", adopt)),
        Check("delete an application's ConfigMap", ("delete", "configmap", "app-config"), POLICY),
        Check("a table owned by no set", ("create", "-f", "-"), POLICY,
              table("unowned", None, TABLE_LABELS)),
        Check("an unlabelled ConfigMap owned by a set", ("create", "-f", "-"), POLICY,
              table("owned", owner, {})),
        Check("forge a worker's ack", ("annotate", "pod", "w-0", f"{ack}=forged"), POLICY),
        Check("relabel a pod", ("label", "pod", "w-0", "app=other", "--overwrite"), POLICY),
        Check("change a pod's image", ("set", "image", "pod/w-0", "worker=evil:1"), POLICY),
        Check("another annotation on a pod", ("annotate", "pod", "w-0", "x=y"), POLICY),
        # `kubectl patch` reads first, and the operator may not `get` a set: PATCH directly.
        Check("change a set's spec",
              ("PATCH", f"/apis/apportion.dev/v1alpha1/namespaces/{ns}/partitionsets/guarded"),
              POLICY, '{"spec":{"selector":{"matchLabels":{"app":"stolen"}}}}'),
        Check("delete a pod", ("delete", "pod", "w-0", "--wait=false"), RBAC),
        Check("read Secrets", ("get", "secrets"), RBAC),
        Check("delete a set", ("delete", "partitionset", "guarded"), RBAC),
    ]  # fmt: skip


def merge_patch(
    cluster: DevCluster, token: str, path: str, body: str
) -> subprocess.CompletedProcess[str]:
    """A merge PATCH of `path` with `token`, as kubectl's result would be."""
    request = urllib.request.Request(
        cluster.server + path,
        data=body.encode(),
        method="PATCH",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/merge-patch+json",
        },
    )
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return subprocess.CompletedProcess([path], 0, response.read().decode(), "")
    except urllib.error.HTTPError as error:
        return subprocess.CompletedProcess([path], error.code, "", error.read().decode())


@pytest.fixture
def guarded(dev_cluster: DevCluster, teams: list[Team]) -> Team:
    """In team a's namespace: an application's ConfigMap, a worker pod and a set (no operator
    runs: nothing else writes there)."""
    team = teams[0]
    kubectl = dev_cluster.kubectl
    kubectl("create", "configmap", "app-config", "--from-literal=a=1", "-n", team.namespace)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "w-0", "labels": {"app": "guarded"}},
        "spec": {"containers": [{"name": "worker", "image": "example.invalid/worker:1"}]},
    }
    apply(kubectl, team.namespace, pod, partitionset("guarded", "nothing"))
    return team


def test_the_operator_token_is_refused_every_write_outside_its_rights(
    dev_cluster: DevCluster, teams: list[Team], guarded: Team, tmp_path: Path, wait_for
) -> None:
    operator = as_user(dev_cluster, tmp_path / "a.kubeconfig", guarded.namespace, guarded.token)
    # A new policy takes a moment to be enforced: wait until it refuses something (two rules
    # probed, so that one rule taken out, see below, still lets the checks run).
    wait_for(
        lambda: (
            POLICY in operator("create", "configmap", "policy-probe").stderr
            or POLICY in operator("annotate", "pod", "w-0", "probe=1").stderr
        ),
        timeout=30,
        message="the operator policy is not enforced",
    )
    tried = checks(dev_cluster.kubectl, guarded, teams[1])
    wrong = []
    for check in tried:
        if check.args[0] == "PATCH":
            result = merge_patch(dev_cluster, guarded.token, check.args[1], check.input or "")
        else:
            result = operator(*check.args, input=check.input)
        if result.returncode == 0 or check.refused_by not in result.stderr:
            wrong.append(f"{check.what}: {result.returncode} {result.stdout}{result.stderr}")
    print(f"refused {len(tried) - len(wrong)} of {len(tried)} writes outside the operator's rights")
    assert not wrong, "\n".join(wrong)
    assert len(tried) >= 12


def test_the_operator_token_may_write_its_tables_and_the_deletion_cost(
    dev_cluster: DevCluster, guarded: Team, tmp_path: Path, wait_for
) -> None:
    """The writes of apportion.publishing, with the token alone: create, replace and delete a
    table its set controls, and patch a pod's deletion cost."""
    ns = guarded.namespace
    operator = as_user(dev_cluster, tmp_path / "a.kubeconfig", ns, guarded.token)
    owner = get(dev_cluster.kubectl, ns, "partitionset", "guarded")
    created = operator("create", "-f", "-", input=table("guarded", owner, TABLE_LABELS))
    assert created.returncode == 0, created.stderr

    def fill(obj: Any) -> None:
        obj["data"] = {"assignment": "{}"}

    result = operator(
        "replace", "-f", "-", input=replaced(dev_cluster.kubectl, ns, "guarded", fill)
    )
    assert result.returncode == 0, result.stderr
    result = operator("annotate", "pod", "w-0", f"{DELETION_COST}=-7", "--overwrite")
    assert result.returncode == 0, result.stderr
    result = operator("delete", "configmap", "guarded")
    assert result.returncode == 0, result.stderr


def events_by(kubectl: Callable[..., Any], ns: str) -> set[str]:
    """reportingInstance of every Event apportion's operators posted in `ns`."""
    found = json.loads(kubectl("get", "events.events.k8s.io", "-n", ns, "-o", "json").stdout)
    return {
        e.get("reportingInstance", "")
        for e in found["items"]
        if e.get("reportingController") in (REPORTING_CONTROLLER, "apportion-operator")  # kopf's
    }


def test_two_teams_operators_run_under_their_tokens_and_never_cross(
    dev_cluster: DevCluster, teams: list[Team], tmp_path: Path, wait_for
) -> None:
    kubectl = dev_cluster.kubectl
    operators = [
        Operator(
            dev_cluster, team.namespace, tmp_path / f"{team.name}.log",
            leader_election="apportion-operator", lease_namespace=team.system,
            identity=f"team-{team.name}-0",
            kubeconfig=token_kubeconfig(
                dev_cluster, tmp_path / f"{team.name}.kubeconfig", team.token, team.namespace
            ),
        )
        for team in teams
    ]  # fmt: skip
    try:
        for team in teams:
            apply(kubectl, team.namespace, workers("w", 2), partitionset("mine", "w"))
        for team, operator in zip(teams, operators, strict=True):
            result = kubectl(
                "wait", "-n", team.namespace, "--for=condition=Ready", "partitionset/mine",
                "--timeout=90s", check=False,
            )  # fmt: skip
            assert result.returncode == 0, f"{result.stderr}\n{operator.text()}"
        for team in teams:
            identity = f"team-{team.name}-0"
            lease = get(kubectl, team.system, "lease", "apportion-operator")
            assert lease["spec"]["holderIdentity"] == identity
            # Published, with the deletion cost of each pod patched and Events posted, by this
            # team's operator alone.
            tables = get(kubectl, team.namespace, "configmap", "-l", "apportion.dev/set-kind")
            assert tables["items"], f"no table in {team.namespace}"
            wait_for(
                lambda team=team: all(
                    DELETION_COST in p["metadata"].get("annotations", {})
                    for p in get(kubectl, team.namespace, "pods", "-l", "app=w")["items"]
                ),
                message=f"no deletion cost on the pods of {team.namespace}",
            )
            wait_for(
                lambda team=team: events_by(kubectl, team.namespace),
                message=f"no Event in {team.namespace}",
            )
            assert events_by(kubectl, team.namespace) == {identity}
    finally:
        codes = [operator.stop() for operator in operators]
    for operator, code in zip(operators, codes, strict=True):
        text = operator.text()
        assert code == 0, text
        for word in ("Traceback", "403", "Forbidden"):
            assert word not in text, text
