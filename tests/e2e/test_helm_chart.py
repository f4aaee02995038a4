"""The Helm chart (charts/apportion) with the real helm, built from its Go module
(`apportion_dev.devcluster.tools.HELM`): it lints, it renders the same objects as the kustomize base
(`kubectl kustomize manifests/` with the dev-cluster's kubectl) apart from the differences listed
here, its values do what values.yaml says, the API server accepts it in a server-side dry run,
and `helm install`, `upgrade` and `uninstall` on a cluster of their own do what
docs/operations.md says."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from apportion_dev.devcluster import DevCluster, ensure_built
from apportion_dev.devcluster.tools import HELM

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "apportion"
NAMESPACE = "apportion-system"

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def render(helm) -> Render:
    """`helm template` of the chart (CRDs included) with `--set` values, as objects."""

    def template(*sets: str) -> list[dict[str, Any]]:
        flags = [flag for value in sets for flag in ("--set", value)]
        rendered = helm(
            "template", "apportion", str(CHART), "-n", NAMESPACE, "--include-crds", *flags
        )
        return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]

    return template


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace", "")


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    keyed = {key(obj): obj for obj in objects}
    assert len(keyed) == len(objects), "two objects of the same kind, name and namespace"
    return keyed


def container(statefulset: dict[str, Any]) -> dict[str, Any]:
    (only,) = statefulset["spec"]["template"]["spec"]["containers"]
    return only


CRDS = (
    "graintypes.apportion.dev",
    "partitionsets.apportion.dev",
    "shardsets.apportion.dev",
)
# What the chart with default values leaves out of the kustomize base, and adds to it.
BASE_ONLY = {("Namespace", NAMESPACE, "")}  # `helm install --create-namespace` makes it
CHART_ONLY = {("NetworkPolicy", "apportion-operator", NAMESPACE)}  # needs values to narrow
METRICS_ARG = "--metrics=0.0.0.0:8081"


def without_chart_additions(obj: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The chart's object less what it adds on purpose: Helm's release labels (the base's
    labels must all be there) and imagePullPolicy. CRDs
    are the files in crds/ as they are (Helm never templates them), without the base's label."""
    obj = copy.deepcopy(obj)
    crd = obj["kind"] == "CustomResourceDefinition"
    pairs = [] if crd else [(obj["metadata"], base["metadata"])]
    if crd:
        obj["metadata"]["labels"] = base["metadata"].get("labels", {})
    if obj["kind"] == "StatefulSet":
        pairs.append((obj["spec"]["template"]["metadata"], base["spec"]["template"]["metadata"]))
        assert container(obj).pop("imagePullPolicy") == "IfNotPresent"
    for ours, theirs in pairs:
        labels = ours.pop("labels", {})
        assert theirs.get("labels", {}).items() <= labels.items(), key(obj)
        ours["labels"] = theirs.get("labels", {})
    return obj


def test_helm_is_the_pinned_release(helm) -> None:
    version = helm("version", "--template", "{{.Version}}").stdout
    go_mod = (REPO / "devtools" / "go" / "tools" / HELM.name / "go.mod").read_text()
    assert f"{HELM.module_path} {version}" in go_mod


@pytest.mark.parametrize(
    "values",
    [(), ("metrics.serviceMonitor.enabled=true", "watchedNamespaces={team-a}", "replicas=1")],
)
def test_helm_lint_accepts_the_chart(helm, values: tuple[str, ...]) -> None:
    flags = [flag for value in values for flag in ("--set", value)]
    result = helm("lint", "--strict", str(CHART), *flags)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_the_chart_renders_the_objects_of_the_kustomize_base(render: Render) -> None:
    kubectl = ensure_built() / "kubectl"
    kustomized = subprocess.run(
        [str(kubectl), "kustomize", str(REPO / "manifests")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    base = by_key([doc for doc in yaml.safe_load_all(kustomized) if doc])
    chart = by_key(render())
    assert set(chart) - set(base) == CHART_ONLY
    assert set(base) - set(chart) == BASE_ONLY
    for shared in set(chart) & set(base):
        # images, args, ports, probes, securityContext, resources, RBAC rules, CRD schemas
        assert without_chart_additions(chart[shared], base[shared]) == base[shared], shared


def test_the_comparison_sees_a_changed_field(render: Render) -> None:
    """The comparison above can fail: a value that changes the operator's pods shows."""
    (default,) = [o for o in render() if o["kind"] == "StatefulSet"]
    (changed,) = [
        o
        for o in render("securityContext.readOnlyRootFilesystem=false")
        if o["kind"] == "StatefulSet"
    ]
    assert without_chart_additions(changed, default) != without_chart_additions(default, default)


def test_watched_namespaces_replace_all_namespaces(render: Render) -> None:
    (statefulset,) = [
        o for o in render("watchedNamespaces={team-a,team-*}") if o["kind"] == "StatefulSet"
    ]
    args = container(statefulset)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-*",
    ]


def test_metrics_can_be_turned_off(render: Render) -> None:
    objects = render("metrics.enabled=false", "metrics.serviceMonitor.enabled=true")
    (statefulset,) = [o for o in objects if o["kind"] == "StatefulSet"]
    assert METRICS_ARG not in container(statefulset)["args"]
    assert [p["name"] for p in container(statefulset)["ports"]] == ["health"]
    (service,) = [o for o in objects if o["kind"] == "Service"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["health"]
    assert not [o for o in objects if o["kind"] == "ServiceMonitor"]


def test_the_worker_policy_can_be_turned_off(render: Render) -> None:
    """Only for clusters older than 1.30: the worker role stays, the policy goes."""
    kinds = {key(obj)[:2] for obj in render("workerPolicy.enabled=false")}
    assert ("ClusterRole", "apportion-worker") in kinds
    assert not {name for kind, name in kinds if name == "apportion-worker-writes"}
    assert ("ValidatingAdmissionPolicy", "apportion-operator-writes") in kinds
    defaults = {key(obj)[:2] for obj in render()}
    assert ("ValidatingAdmissionPolicy", "apportion-worker-writes") in defaults


def test_the_operator_policy_can_be_turned_off(render: Render) -> None:
    names = {key(obj)[:2] for obj in render("operatorPolicy.enabled=false")}
    assert ("ValidatingAdmissionPolicy", "apportion-worker-writes") in names
    assert ("ValidatingAdmissionPolicy", "apportion-operator-writes") not in names
    assert ("ValidatingAdmissionPolicy", "apportion-operator-writes") in {
        key(obj)[:2] for obj in render()
    }


def rules_of(obj: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in obj["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_watched_namespaces_get_roles_and_the_cluster_only_reads(render: Render) -> None:
    """Least privilege: with exact namespaces the operator's rules are a Role in each of them
    (the same rules the cluster-wide role has there) and cluster-wide it only reads namespaces
    and CRDs; a second release (sharedObjects.enabled=false) renders no shared object."""
    default = by_key(render())
    objects = by_key(render("watchedNamespaces={team-a,team-b}", "sharedObjects.enabled=false"))
    cluster_wide = {k for k in objects if k[0].startswith("Cluster") or k[2] == ""}
    assert cluster_wide - {("CustomResourceDefinition", c, "") for c in CRDS} == {
        ("ClusterRole", f"apportion-operator-{NAMESPACE}", ""),
        ("ClusterRoleBinding", f"apportion-operator-{NAMESPACE}", ""),
    }
    reads = rules_of(objects[("ClusterRole", f"apportion-operator-{NAMESPACE}", "")])
    assert {verb for _, _, verb in reads} == {"list", "watch"}
    assert {resource for _, resource, _ in reads} == {"namespaces", "customresourcedefinitions"}
    everything = rules_of(default[("ClusterRole", "apportion-operator", "")])
    for team in ("team-a", "team-b"):
        role = objects[("Role", "apportion-operator", team)]
        assert rules_of(role) | reads == everything
        binding = objects[("RoleBinding", "apportion-operator", team)]
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    globbed = by_key(render("watchedNamespaces={team-*}"))
    assert ("ClusterRoleBinding", "apportion-operator", "") in globbed  # a Role cannot say team-*


def test_the_network_policy_limits_the_operator_and_can_be_turned_off(render: Render) -> None:
    (policy,) = [o for o in render() if o["kind"] == "NetworkPolicy"]
    (statefulset,) = [o for o in render() if o["kind"] == "StatefulSet"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    )
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["spec"]["ingress"]
    assert {p["port"] for p in ingress["ports"]} == {"health", "metrics"}
    egress = {
        (p["port"], p["protocol"]) for rule in policy["spec"]["egress"] for p in rule["ports"]
    }
    assert egress == {(443, "TCP"), (6443, "TCP"), (53, "UDP"), (53, "TCP")}
    peer = {"ipBlock": {"cidr": "10.0.0.1/32"}}
    (narrowed,) = [
        o
        for o in render("networkPolicy.apiServer.to[0].ipBlock.cidr=10.0.0.1/32")
        if o["kind"] == "NetworkPolicy"
    ]
    assert narrowed["spec"]["egress"][0]["to"] == [peer]
    assert not [o for o in render("networkPolicy.enabled=false") if o["kind"] == "NetworkPolicy"]


def test_the_chart_s_pods_meet_the_restricted_pod_security_standard(
    dev_cluster, helm, namespace
) -> None:
    """The operator's pod template and its NetworkPolicy as rendered, admitted into a namespace
    that enforces `restricted` (Pod Security admission enforces on Pods, so the template goes in
    as one)."""
    kubectl = dev_cluster.kubectl
    kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    kubectl("create", "serviceaccount", "apportion-operator", "-n", namespace)
    rendered = helm("template", "apportion", str(CHART), "-n", namespace).stdout
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    (statefulset,) = [o for o in objects if o["kind"] == "StatefulSet"]
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "psa-probe", "namespace": namespace},
        "spec": statefulset["spec"]["template"]["spec"],
    }
    for obj in (pod, policy, statefulset):
        result = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(obj))
        assert "Warning" not in result.stderr, result.stderr
    pod["spec"]["securityContext"] = {}
    refused = kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False)
    assert refused.returncode != 0
    assert "restricted" in refused.stderr, refused.stderr


def test_the_service_monitor_scrapes_the_metrics_service(render: Render) -> None:
    objects = render(
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prometheus",
        "metrics.port=9100",
    )
    (monitor,) = [o for o in objects if o["kind"] == "ServiceMonitor"]
    (statefulset,) = [o for o in objects if o["kind"] == "StatefulSet"]
    services = [o for o in objects if o["kind"] == "Service"]
    selected = [
        s
        for s in services
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == ["apportion-operator"]
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in selected[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert selected[0]["spec"]["selector"].items() <= (
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    )
    (target,) = [p for p in container(statefulset)["ports"] if p["name"] == port["targetPort"]]
    assert target["containerPort"] == port["port"] == 9100
    assert "--metrics=0.0.0.0:9100" in container(statefulset)["args"]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]


def test_the_prometheus_rule_is_the_monitoring_base_one(
    render: Render, helm, tmp_path: Path
) -> None:
    """The chart's PrometheusRule carries the alerts of `kubectl kustomize manifests/monitoring`
    (generated from the same rules file); without the file, enabling it fails loudly."""
    kubectl = ensure_built() / "kubectl"
    kustomized = subprocess.run(
        [str(kubectl), "kustomize", str(REPO / "manifests" / "monitoring")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (base,) = [d for d in yaml.safe_load_all(kustomized) if d["kind"] == "PrometheusRule"]
    rendered = render("metrics.prometheusRule.enabled=true")
    (rule,) = [o for o in rendered if o["kind"] == "PrometheusRule"]
    assert key(rule) == key(base)
    assert rule["spec"] == base["spec"]
    assert len(rule["spec"]["groups"][0]["rules"]) >= 5

    chart = tmp_path / "apportion"
    shutil.copytree(CHART, chart, symlinks=False)
    (chart / "files" / "rules.yaml").unlink()
    failed = helm(
        "template", "x", str(chart), "--set", "metrics.prometheusRule.enabled=true", check=False
    )
    assert failed.returncode != 0
    assert "files/rules.yaml" in failed.stderr


def test_the_api_server_accepts_the_rendered_chart(dev_cluster, helm) -> None:
    dev_cluster.kubectl("apply", "-f", str(REPO / "manifests" / "namespace.yaml"))
    rendered = helm("template", "apportion", str(CHART), "-n", NAMESPACE, "--include-crds").stdout
    result = dev_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    applied = {line.split()[0] for line in result.stdout.splitlines()}
    assert {
        "customresourcedefinition.apiextensions.k8s.io/partitionsets.apportion.dev",
        "role.rbac.authorization.k8s.io/apportion-operator-leader-election",
        "serviceaccount/apportion-operator",
        "clusterrole.rbac.authorization.k8s.io/apportion-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/apportion-operator",
        "service/apportion-operator",
        "statefulset.apps/apportion-operator",
        "validatingadmissionpolicy.admissionregistration.k8s.io/apportion-worker-writes",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/apportion-worker-writes",
        "validatingadmissionpolicy.admissionregistration.k8s.io/apportion-operator-writes",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/apportion-operator-writes",
        "networkpolicy.networking.k8s.io/apportion-operator",
    } <= applied
    assert len(applied) == len(result.stdout.splitlines()) == 18
    assert all(line.endswith("(server dry run)") for line in result.stdout.splitlines())
    assert "Warning" not in result.stderr, result.stderr


@pytest.fixture
def private_cluster(request: pytest.FixtureRequest) -> Iterator[DevCluster]:
    """A cluster of its own: a release's cluster-wide objects (CRDs, cluster roles) must not meet
    the shared dev-cluster's, which other tests apply with kubectl."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        cluster = DevCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def served_from_cache(cluster: DevCluster, crd: str) -> bool:
    definition = json.loads(cluster.kubectl("get", "crd", crd, "-o", "json").stdout)["spec"]
    path = f"/apis/{definition['group']}/{definition['versions'][0]['name']}"
    listing = f"{path}/{definition['names']['plural']}?resourceVersion=0&limit=1"
    return cluster.kubectl("get", "--raw", listing, check=False).returncode == 0


def test_install_upgrade_and_uninstall_as_the_docs_say(
    private_cluster: DevCluster, helm, wait_for: Callable[..., Any]
) -> None:
    """docs/operations.md's commands: install creates the objects and the CRDs, upgrade changes
    the release, uninstall removes it but keeps the CRDs, which go last with kubectl."""
    kubeconfig = f"--kubeconfig={private_cluster.kubeconfig}"
    release = ("apportion", str(CHART), "-n", NAMESPACE, kubeconfig)
    helm("install", *release, "--create-namespace")

    def exists(*resource: str) -> bool:
        found = private_cluster.kubectl("get", *resource, "-o", "name", check=False)
        return found.returncode == 0

    assert exists("crd", *CRDS)
    assert exists("clusterrole", "apportion-operator", "apportion-worker")
    for crd in CRDS:
        # Served from the API server's watch cache once it is ready. Deleting a CRD before that
        # (only a test is this quick) fails its clean-up with "storage is (re)initializing" and
        # retries with a back-off that can outlast any wait.
        wait_for(lambda crd=crd: served_from_cache(private_cluster, crd), message=crd)
    statefulset = ("statefulset", "apportion-operator", "-n", NAMESPACE)
    assert (
        private_cluster.kubectl("get", *statefulset, "-o", "jsonpath={.spec.replicas}").stdout
        == "2"
    )

    helm("upgrade", *release, "--set", "replicas=1")
    assert (
        private_cluster.kubectl("get", *statefulset, "-o", "jsonpath={.spec.replicas}").stdout
        == "1"
    )
    status = helm("status", "apportion", "-n", NAMESPACE, kubeconfig).stdout
    assert "STATUS: deployed" in status
    assert "REVISION: 2" in status

    helm("uninstall", "apportion", "-n", NAMESPACE, kubeconfig)
    assert not exists(*statefulset)
    assert not exists("clusterrole", "apportion-operator")
    assert exists("crd", "partitionsets.apportion.dev")  # Helm keeps what crds/ installed
    private_cluster.kubectl("delete", "-f", str(CHART / "crds"))
    assert not [crd for crd in CRDS if exists("crd", crd)]
