"""Installing apportion from a release alone, on the real node, as a user's cluster does: the
release (`scripts/release.py --only images --only chart` of this checkout stamped with a version
nothing else has) is pushed into the dev-cluster's registry, whose containerd pulls the published
names (`ghcr.io/apportion/...:<v>`) through its mirror. No image name is rewritten and nothing is
read from the checkout: the operator comes from `helm install oci://… --version <v>` and from
`kubectl apply -f install.yaml` and from Flux (an OCIRepository of the release's manifests
artifact, then a set from Git once the operator is Ready), the workers from the release's
samples, and each turns a PartitionSet Ready from images the registry served (the pods' image
digests are the registry's).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from scripts import release_images

from apportion.api.assignment import (
    AssignmentTable,
    ConfigMapPayload,
    assignment_config_map,
    decode_assignment,
)
from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster import registry as oci
from apportion_dev.devcluster.argocd import NAMESPACE as ARGOCD_NAMESPACE
from apportion_dev.devcluster.argocd import ArgoCD
from apportion_dev.devcluster.flux import Flux
from apportion_dev.devcluster.realnode.host import CLUSTER_CIDR, GATEWAY
from apportion_dev.gitserver import GitServer
from tests.e2e.conftest import install_crds
from tests.support import release
from tests.support.argocd import ArgoApp, health_status, sync_status
from tests.support.argocd import shipped as argocd_shipped
from tests.support.flux import KUSTOMIZE_API, SOURCE_API, condition
from tests.support.gitops import ObjectWatch
from tests.support.postgres import PostgresServer
from tests.support.unitset import Ownership, ownership_lines, read_table
from tests.support.waiting import wait_for

pytestmark = pytest.mark.realnode

REPO = Path(__file__).resolve().parents[2]
VERSION = f"0.0.{secrets.randbelow(900_000) + 100_000}"
SYSTEM = "apportion-system"
OPERATOR_IMAGE = release_images.OPERATOR.tag(VERSION)
DEMO_IMAGE = release_images.DEMO.tag(VERSION)
GIT_PATH = "deploy"
SETS_AND_OPERATOR = ("sets", "apportion-operator")


@dataclass(frozen=True)
class Published:
    cluster: DevCluster
    dist: Path

    def digest(self, image: str) -> str:
        assert self.cluster.registry is not None
        return oci.served_digest(image, self.cluster.registry)


@pytest.fixture(scope="module")
def published(
    real_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Published]:
    """The release built and pushed; no operator installed before or after the module."""
    dist = release.stamped(tmp_path_factory.mktemp("release"), VERSION, ["images", "chart"])
    assert real_cluster.registry is not None
    pushed = oci.publish(dist, real_cluster.registry)
    assert len(pushed) == 4, pushed  # two images, the chart and the manifests artifact
    forget_images(VERSION)
    remove_operator(real_cluster)
    yield Published(real_cluster, dist)
    remove_operator(real_cluster)


def forget_images(version: str) -> None:
    """The release's images leave buildah's store once pushed (the registry and dist/ hold them):
    every run builds a new version, which would otherwise keep ~300 MB more on the disk."""
    for image in release_images.IMAGES:
        oci.buildah("rmi", image.tag(version))


def remove_operator(cluster: DevCluster) -> None:
    """Whatever installed the operator (kustomize, Helm, install.yaml) goes, but the CRDs, which
    other modules' sets live on."""
    rendered = yaml.safe_load_all(cluster.kubectl("kustomize", str(REPO / "manifests")).stdout)
    kept = [d for d in rendered if d and d["kind"] != "CustomResourceDefinition"]
    cluster.kubectl(
        "delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump_all(kept)
    )
    wait_for(
        lambda: cluster.kubectl("get", "namespace", SYSTEM, check=False).returncode != 0,
        timeout=180,
        message=f"namespace {SYSTEM} never went",
    )


def pods(cluster: DevCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    listing = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return list(json.loads(listing.stdout)["items"])


def operator_pods(cluster: DevCluster) -> list[dict[str, Any]]:
    return pods(cluster, SYSTEM, "app.kubernetes.io/name=apportion-operator")


def ran_from_the_registry(published: Published, pods: list[dict[str, Any]], image: str) -> None:
    """Each pod's container runs `image`, by the digest the registry serves for it."""
    digest = published.digest(image)
    assert pods
    for pod in pods:
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"] == image, status
        assert status["imageID"].endswith(f"@{digest}"), (status["imageID"], digest)
        assert status["ready"] is True, status


def places_the_sample(published: Published, prefix: str) -> None:
    """The release's PartitionSet sample turns Ready in a namespace of its own, its workers
    running the published demo image."""
    cluster = published.cluster
    namespace = f"{prefix}-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    sample = published.dist / "samples" / "partitionset-demo.yaml"
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", str(sample))

        def ready() -> bool:
            found = cluster.kubectl("get", "-n", namespace, "pset", "demo", "-o", "json")
            conditions = json.loads(found.stdout).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_for(ready, timeout=300, message=f"the sample in {namespace} never turned Ready")
        ran_from_the_registry(published, pods(cluster, namespace, "app=demo-workers"), DEMO_IMAGE)
    finally:
        cluster.kubectl(
            "delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False
        )


def test_helm_installs_the_pinned_chart_from_the_registry(
    published: Published, helm: Callable[..., Any]
) -> None:
    cluster = published.cluster
    chart = f"oci://{cluster.registry}/{oci.CHART_REPOSITORY}/apportion"
    kubeconfig = f"--kubeconfig={cluster.kubeconfig}"
    helm(
        "install", "apportion", chart, "--version", VERSION, "--plain-http",
        "-n", SYSTEM, "--create-namespace", kubeconfig, "--wait", "--timeout=300s",
        timeout=360,
    )  # fmt: skip
    try:
        (listed,) = json.loads(helm("list", "-n", SYSTEM, kubeconfig, "-o", "json").stdout)
        assert listed["chart"] == f"apportion-{VERSION}"
        assert listed["app_version"] == VERSION
        pods = operator_pods(cluster)
        assert len(pods) == 2
        ran_from_the_registry(published, pods, OPERATOR_IMAGE)
        places_the_sample(published, "helm-release")
    finally:
        helm("uninstall", "apportion", "-n", SYSTEM, kubeconfig, "--wait", check=False)
        remove_operator(cluster)


def test_install_yaml_installs_the_operator_the_release_names(published: Published) -> None:
    cluster = published.cluster
    install = published.dist / "install.yaml"
    try:
        cluster.kubectl("apply", "-f", str(install))
        cluster.kubectl(
            "rollout",
            "status",
            "-n",
            SYSTEM,
            "statefulset/apportion-operator",
            "--timeout=300s",
            timeout=360,
        )
        pods = operator_pods(cluster)
        assert len(pods) == 2
        ran_from_the_registry(published, pods, OPERATOR_IMAGE)
        places_the_sample(published, "install-yaml")
    finally:
        remove_operator(cluster)


def flux_operator(published: Published, namespace: str, tag: str) -> list[dict[str, Any]]:
    """The operator from the release's Flux artifact (OCIRepository `tag`), waited for (kstatus)."""
    meta = {"namespace": namespace}
    return [
        {
            "apiVersion": SOURCE_API,
            "kind": "OCIRepository",
            "metadata": {"name": "apportion", **meta},
            "spec": {
                "url": f"oci://{published.cluster.registry}/{oci.MANIFESTS_REPOSITORY}",
                "ref": {"tag": tag},
                "insecure": True,
                "interval": "10m",
            },
        },
        {
            "apiVersion": KUSTOMIZE_API,
            "kind": "Kustomization",
            "metadata": {"name": "apportion-operator", **meta},
            "spec": {
                "sourceRef": {"kind": "OCIRepository", "name": "apportion"},
                "path": "./",
                "interval": "10m",
                "retryInterval": "5s",
                "timeout": "5m",
                "prune": True,
                "wait": True,
            },
        },
    ]


def flux_objects(published: Published, namespace: str, git_url: str) -> list[dict[str, Any]]:
    """The operator of this release from Flux, and a set from Git applied only once the
    operator's Kustomization is Ready (dependsOn), both waited for (kstatus)."""
    meta = {"namespace": namespace}
    return [
        *flux_operator(published, namespace, VERSION),
        {
            "apiVersion": SOURCE_API,
            "kind": "GitRepository",
            "metadata": {"name": "sets", **meta},
            "spec": {"url": git_url, "ref": {"branch": "main"}, "interval": "10m"},
        },
        {
            "apiVersion": KUSTOMIZE_API,
            "kind": "Kustomization",
            "metadata": {"name": "sets", **meta},
            "spec": {
                "dependsOn": [{"name": "apportion-operator"}],
                "sourceRef": {"kind": "GitRepository", "name": "sets"},
                "path": f"./{GIT_PATH}",
                "targetNamespace": namespace,
                "interval": "10m",
                "retryInterval": "5s",
                "timeout": "5m",
                "prune": True,
                "wait": True,
            },
        },
    ]


def test_flux_installs_the_operator_from_the_oci_artifact_then_a_set_from_git(
    published: Published, tmp_path: Path
) -> None:
    cluster = published.cluster
    namespace = f"flux-install-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    sample = (published.dist / "samples" / "partitionset-demo.yaml").read_text()
    with Flux.start(cluster, tmp_path / "flux") as flux, GitServer(tmp_path / "git") as git:
        repository = git.create("sets")
        repository.write(f"{GIT_PATH}/partitionset-demo.yaml", sample)
        kustomization = {"resources": ["partitionset-demo.yaml"]}
        repository.write(f"{GIT_PATH}/kustomization.yaml", yaml.safe_dump(kustomization))
        sha = repository.commit("the PartitionSet sample")
        objects = flux_objects(published, namespace, git.url("sets"))
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        try:
            wait_for(
                lambda: applied(flux, namespace, "sets", lambda r: r.endswith(sha)),
                timeout=420,
                message=lambda: json.dumps(
                    {
                        n: flux.get("kustomization", namespace, n).get("status")
                        for n in SETS_AND_OPERATOR
                    }
                ),
            )
            operator = applied(
                flux, namespace, "apportion-operator", lambda r: r.startswith(f"{VERSION}@sha256:")
            )
            assert operator is not None
            ran_from_the_registry(published, operator_pods(cluster), OPERATOR_IMAGE)
            # dependsOn: the set was created only after the operator's Kustomization was Ready.
            found = cluster.kubectl("get", "-n", namespace, "pset", "demo", "-o", "json")
            pset = json.loads(found.stdout)
            assert condition(pset, "Ready").get("status") == "True"
            operator_ready = condition(operator, "Ready")["lastTransitionTime"]
            assert pset["metadata"]["creationTimestamp"] >= operator_ready
        finally:
            # The set goes with its Kustomization, before the operator's.
            cluster.kubectl(
                "delete", "-n", namespace, "--timeout=120s", "kustomization", "sets", check=False
            )
            remove_flux_operator(cluster, namespace)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def applied(
    flux: Flux, namespace: str, name: str, revision: Callable[[str], bool]
) -> dict[str, Any] | None:
    """The Kustomization once Ready with a `revision` applied (Ready can come a moment before
    lastAppliedRevision is written)."""
    found = flux.get("kustomization", namespace, name)
    done = found.get("status", {}).get("lastAppliedRevision", "")
    return found if condition(found, "Ready").get("status") == "True" and revision(done) else None


def remove_flux_operator(cluster: DevCluster, namespace: str) -> None:
    """The operator's Kustomization is told not to prune first, or its CRDs, which every set of
    the cluster lives on, would go with it; then the Flux objects and the operator go."""
    flux_delete = ("delete", "-n", namespace, "--timeout=120s")
    cluster.kubectl(
        "patch", "-n", namespace, "kustomization", "apportion-operator", "--type=merge",
        "-p", json.dumps({"spec": {"prune": False}}), check=False,
    )  # fmt: skip
    cluster.kubectl(*flux_delete, "kustomization", "apportion-operator", check=False)
    cluster.kubectl(*flux_delete, "ocirepository,gitrepository", "--all", check=False)
    remove_operator(cluster)


def argocd_operator(published: Published) -> dict[str, Any]:
    """The shipped manifests/argocd/operator.yaml for this release: the chart from the
    dev-cluster's registry (the published name, its host changed) at VERSION."""
    app = argocd_shipped("operator.yaml")
    source = app["spec"]["source"]
    assert source["repoURL"] == f"oci://ghcr.io/{oci.CHART_REPOSITORY}/apportion"
    source["repoURL"] = f"oci://{published.cluster.registry}/{oci.CHART_REPOSITORY}/apportion"
    source["targetRevision"] = VERSION
    return app


def plain_http_repository(url: str) -> dict[str, Any]:
    """What Argo CD needs for the dev-cluster's plain-HTTP registry, and ghcr.io does not: a
    repository Secret for the chart's URL (docs/gitops.md)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "apportion-chart",
            "namespace": ARGOCD_NAMESPACE,
            "labels": {"argocd.argoproj.io/secret-type": "repository"},
        },
        "stringData": {"type": "oci", "url": url, "insecureOCIForceHttp": "true"},
    }


def apportion_crds(cluster: DevCluster) -> list[dict[str, Any]]:
    listing = cluster.kubectl(
        "get", "crd", "-l", "app.kubernetes.io/part-of=apportion", "-o", "json",
        "--show-managed-fields",
    )  # fmt: skip
    return list(json.loads(listing.stdout)["items"])


def remove_crds(cluster: DevCluster) -> None:
    """The CRDs go too, so that the Application is seen installing them; no set may be left
    (deleting a CRD deletes its objects)."""
    if not apportion_crds(cluster):
        return
    assert not cluster.kubectl("get", "apportion", "-A", "-o", "name").stdout.strip()
    cluster.kubectl("delete", "crd", "-l", "app.kubernetes.io/part-of=apportion", "--wait=true")
    assert not apportion_crds(cluster)


def test_argocd_installs_the_operator_from_the_released_chart_beside_a_set_from_git(
    published: Published, tmp_path: Path
) -> None:
    """Both Applications created at once, as a cluster's bootstrap does: the operator's
    (operator.yaml) syncs the chart, CRDs first; the set's (application.yaml) fails while the
    CRDs are missing and its retry syncs it once they exist. Deleting the operator's Application
    removes the operator and keeps the CRDs and the set."""
    cluster = published.cluster
    remove_crds(cluster)
    namespace = f"argocd-install-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    sample = yaml.safe_load_all((published.dist / "samples" / "partitionset-demo.yaml").read_text())
    operator_app = argocd_operator(published)
    repository = plain_http_repository(operator_app["spec"]["source"]["repoURL"])
    with (
        ArgoCD.start(cluster, tmp_path / "argocd") as argocd,
        GitServer(tmp_path / "git") as git,
    ):
        sets = ArgoApp(argocd, git, namespace)
        sha = sets.commit({"partitionset-demo.yaml": [o for o in sample if o]}, "the sample")
        operator_manifests = yaml.safe_dump_all([repository, operator_app])
        cluster.kubectl("apply", "-f", "-", input=operator_manifests)
        sets.install()
        try:
            healthy = sets.wait(sha, "Healthy", wait_for, timeout=420)
            operator = wait_for(
                lambda: operator_synced(argocd, published),
                timeout=120,
                message=lambda: json.dumps(argocd.application("apportion").get("status")),
            )
            ran_from_the_registry(published, operator_pods(cluster), OPERATOR_IMAGE)
            # CRDs first: the chart's CRDs, installed by this Application, before its operator.
            (statefulset,) = json.loads(
                cluster.kubectl("get", "-n", SYSTEM, "statefulset", "-o", "json").stdout
            )["items"]
            started = statefulset["metadata"]["creationTimestamp"]
            crds = apportion_crds(cluster)
            assert len(crds) == 3
            for crd in crds:
                # applied by Argo CD: they carry no tracking annotation, their field manager
                # says who wrote them
                managers = {m["manager"] for m in crd["metadata"]["managedFields"]}
                assert "argocd-controller" in managers, managers
                assert crd["metadata"]["creationTimestamp"] <= started
            # the set's first attempts found no PartitionSet kind; a retry applied it
            pset = json.loads(
                cluster.kubectl("get", "-n", namespace, "pset", "demo", "-o", "json").stdout
            )
            assert pset["metadata"]["creationTimestamp"] >= max(
                c["metadata"]["creationTimestamp"] for c in crds
            )
            print(
                "argocd install:",
                json.dumps(
                    {
                        "set_sync_retries": healthy["status"]["operationState"].get(
                            "retryCount", 0
                        ),
                        "operator_revision": operator["status"]["sync"]["revision"],
                    }
                ),
            )
            # A second comparison finds nothing to change: no drift from the operator's own
            # writes or the API server's defaults, with no ignoreDifferences.
            argocd.refresh("apportion")
            wait_for(
                lambda: compared_again(argocd, operator),
                timeout=60,
                message=lambda: json.dumps(argocd.application("apportion").get("status")),
            )
            assert sync_status(argocd.application("apportion")) == "Synced"
        finally:
            sets.delete()
            cluster.kubectl(
                "delete", "-n", ARGOCD_NAMESPACE, "application", "apportion", "--timeout=180s",
                check=False,
            )  # fmt: skip
        # The operator went with its Application; the CRDs stayed (Argo CD never cascades a CRD).
        assert not operator_pods(cluster)
        assert len(apportion_crds(cluster)) == 3
    remove_operator(cluster)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def operator_synced(argocd: ArgoCD, published: Published) -> dict[str, Any] | None:
    """The operator's Application once synced at the chart's digest, its last sync done, and
    Healthy (the operator's StatefulSet ready)."""
    app = argocd.application("apportion")
    status = app.get("status", {})
    chart = published.digest(f"ghcr.io/{oci.CHART_REPOSITORY}/apportion:{VERSION}")
    done = status.get("operationState", {})
    return (
        app
        if sync_status(app) == "Synced"
        and status["sync"].get("revision") == chart
        and done.get("phase") == "Succeeded"
        and health_status(app) == "Healthy"
        else None
    )


def compared_again(argocd: ArgoCD, before: dict[str, Any]) -> bool:
    after = argocd.application("apportion").get("status", {})
    return bool(after.get("reconciledAt", "") > before["status"]["reconciledAt"])


# N-1: the release of an earlier commit, cut by the same command: the last one CI landed before
# this suite's upgrade tests grew (stop 37). Its CRDs take server-side apply, which Flux uses;
# an earlier commit's listed one CEL rule twice and no Flux could install it (CHANGELOG, Fixed).
PREVIOUS_COMMIT = "e3de933"
PREVIOUS = f"0.0.{secrets.randbelow(900_000) + 100_000}"
TRAFFIC_WINDOW = 20.0  # seconds of traffic watched after each step, for a move to show


@pytest.fixture(scope="module")
def previous(published: Published, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Release N-1 built and pushed beside N."""
    work = tmp_path_factory.mktemp("previous")
    dist = release.stamped(work, PREVIOUS, ["images", "chart"], revision=PREVIOUS_COMMIT)
    assert published.cluster.registry is not None
    oci.publish(dist, published.cluster.registry)
    forget_images(PREVIOUS)
    return dist


@dataclass(frozen=True)
class SampleSet:
    """A set of the release's samples and its StatefulSet of demo workers."""

    kind: str
    name: str
    workers: str
    sample: str

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def table(self) -> str:
        """The name of the ConfigMap its assignment is published in."""
        return assignment_config_map(self.kind, self.name)


UPGRADED_SETS = (
    SampleSet("PartitionSet", "demo", "demo-workers", "partitionset-demo.yaml"),
    SampleSet("ShardSet", "carts", "cart-workers", "shardset-demo.yaml"),
)


def upgrade_workload(dist: Path, postgres: str) -> list[dict[str, Any]]:
    """N-1's PartitionSet and ShardSet samples with every request written to PostgreSQL through
    the fence, placed by count, and the traffic generator aimed at both (20 requests/s)."""
    docs = [
        d
        for s in UPGRADED_SETS
        for d in yaml.safe_load_all((dist / "samples" / s.sample).read_text())
        if d
    ]
    traffic = [
        d for d in yaml.safe_load_all((dist / "samples" / "traffic-demo.yaml").read_text()) if d
    ]
    for doc in docs:
        if doc["kind"] in ("PartitionSet", "ShardSet"):
            # A worker pod replaced by a rolling update gets its units back, not its siblings.
            doc["spec"]["rebalance"].update(handoffTimeout="20s", restartGrace="2m")
            # Placed by count, not by the measured load: under traffic Balanced moves units
            # for the load alone, which is its business; here any move is the upgrade's.
            doc["spec"].pop("metrics", None)
        if doc["kind"] == "StatefulSet":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            container["env"].append({"name": "APPORTION_DEMO_POSTGRES", "value": postgres})
    for doc in traffic:
        if doc["kind"] == "ConfigMap":
            doc["data"]["rate"] = "20"
        if doc["kind"] == "Deployment":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            sets = [f"--set={s.ref}" for s in UPGRADED_SETS]
            container["command"] = [*container["command"][:2], *sets]
            # The client is the test's, not part of the upgrade: N's, which tells a request no
            # pod answered (one that just exited) from one answered with an error.
            container["image"] = DEMO_IMAGE
    return docs + traffic


def decoded(sample: SampleSet, versions: list[dict[str, Any]]) -> list[AssignmentTable]:
    return [decode_assignment([ConfigMapPayload.from_configmap(v, sample.table)]) for v in versions]


def traffic_since(cluster: DevCluster, namespace: str, since: float) -> Counter[str]:
    """The traffic generator's tallies reported after `since` (epoch seconds), summed."""
    logs = cluster.kubectl(
        "logs", "-n", namespace, "deployment/demo-traffic", "--timestamps"
    ).stdout
    total: Counter[str] = Counter()
    for line in logs.splitlines():
        stamp, _, text = line.partition(" ")
        if "traffic (" not in text or _epoch(stamp) < since:
            continue
        for count, what in re.findall(
            r"(\d+) (requests|ok|redirected|unavailable|unrouted|unreachable|failed|dropped)", text
        ):
            total[what] += int(count)
    return total


def _epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def worker_pods(cluster: DevCluster, namespace: str, sample: SampleSet) -> list[dict[str, Any]]:
    return pods(cluster, namespace, f"app={sample.workers}")


def worker_logs(cluster: DevCluster, namespace: str, sample: SampleSet) -> dict[str, str]:
    return {
        p["metadata"]["name"]: cluster.kubectl(
            "logs", "-n", namespace, p["metadata"]["name"]
        ).stdout
        for p in worker_pods(cluster, namespace, sample)
    }


def runs_through_a_window(cluster: DevCluster, version: str) -> None:
    """Both operator pods run `version` and are Ready; then a window of traffic goes by, for
    the new operators' passes to show whatever they would move."""

    def running() -> bool:
        pods = operator_pods(cluster)
        return len(pods) == 2 and all(
            p["spec"]["containers"][0]["image"].endswith(f":{version}")
            and all(s["ready"] for s in p["status"].get("containerStatuses", []))
            for p in pods
        )

    wait_for(running, timeout=300, message=f"the operator pods never all ran {version}")
    time.sleep(TRAFFIC_WINDOW)


class HelmInstall:
    """The operator from the chart in the registry: `helm install`, `upgrade`, `rollback`."""

    def __init__(self, cluster: DevCluster, helm: Callable[..., Any]) -> None:
        self.cluster, self.helm = cluster, helm
        chart = f"oci://{cluster.registry}/{oci.CHART_REPOSITORY}/apportion"
        self.kubeconfig = f"--kubeconfig={cluster.kubeconfig}"
        self.args = ("apportion", chart, "-n", SYSTEM, self.kubeconfig, "--plain-http", "--wait")

    def install(self, version: str) -> None:
        self.helm(
            "install", *self.args, "--version", version, "--create-namespace", "--timeout=300s",
            timeout=360,
        )  # fmt: skip

    def upgrade(self, version: str) -> None:
        self.helm("upgrade", *self.args, "--version", version, "--timeout=300s", timeout=360)

    def roll_back(self) -> None:
        self.helm(
            "rollback", "apportion", "1", "-n", SYSTEM, self.kubeconfig, "--wait",
            "--timeout=300s", timeout=360,
        )  # fmt: skip

    def remove(self) -> None:
        self.helm("uninstall", "apportion", "-n", SYSTEM, self.kubeconfig, "--wait", check=False)
        remove_operator(self.cluster)


class FluxInstall:
    """The operator from the release's Flux artifact: an OCIRepository pinned to a tag and its
    Kustomization; upgrading and rolling back are changing the tag (a commit, in a user's Git)."""

    def __init__(self, published: Published, flux: Flux) -> None:
        # Flux's objects in a namespace of their own: deleting the workload's namespace must not
        # delete the operator's Kustomization, which would prune the CRDs with it.
        self.published, self.flux = published, flux
        self.namespace = f"flux-upgrade-{secrets.token_hex(3)}"
        flux.cluster.kubectl("create", "namespace", self.namespace)
        self.first: str | None = None

    def install(self, version: str) -> None:
        self.first = version
        objects = flux_operator(self.published, self.namespace, version)
        self.flux.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        self._applied(version)

    def upgrade(self, version: str) -> None:
        self.flux.cluster.kubectl(
            "patch", "-n", self.namespace, "ocirepository", "apportion", "--type=merge",
            "-p", json.dumps({"spec": {"ref": {"tag": version}}}),
        )  # fmt: skip
        self.flux.reconcile_now("ocirepository", self.namespace, "apportion")
        self._applied(version)

    def roll_back(self) -> None:
        assert self.first is not None
        self.upgrade(self.first)

    def remove(self) -> None:
        remove_flux_operator(self.flux.cluster, self.namespace)
        self.flux.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false")
        # The artifacts carry their release's CRDs: N's go back for the modules after this one.
        install_crds(self.flux.cluster)

    def _applied(self, version: str) -> None:
        wait_for(
            lambda: applied(
                self.flux,
                self.namespace,
                "apportion-operator",
                lambda r: r.startswith(f"{version}@"),
            ),
            timeout=420,
            message=lambda: json.dumps(
                self.flux.get("kustomization", self.namespace, "apportion-operator").get("status")
            ),
        )


@pytest.mark.parametrize("installer", ["Helm", "Flux"])
def test_upgrades_and_a_rollback_under_traffic_move_nothing(
    published: Published,
    previous: Path,
    helm: Callable[..., Any],
    tmp_path: Path,
    installer: str,
) -> None:
    """N-1 places a PartitionSet and a ShardSet whose workers write every request through the
    PostgreSQL fence under traffic. The operator is upgraded to N (by Helm, or by Flux following
    a new tag); with Helm, the workers' image is then rolled to N's (StatefulSet rolling updates,
    with `restartGrace`: once is enough, it does not depend on who installed the operator); then
    the operator goes back to N-1. Through the operator's two steps no table changes a unit, no
    worker acquires, releases or stops one, and no request goes unserved; through the workers'
    roll every unit waits for the pod it was on and returns to it (never another pod's, no epoch
    back, no `HandoffTimedOut`). Throughout, no request fails, the fence refuses no write, and
    every write the store took of a unit was made by its owner."""
    cluster = published.cluster
    namespace = f"upgrade-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    with contextlib.ExitStack() as stack:
        if installer == "Helm":
            install: HelmInstall | FluxInstall = HelmInstall(cluster, helm)
        else:
            flux = stack.enter_context(Flux.start(cluster, tmp_path / "flux"))
            install = FluxInstall(published, flux)
        stack.callback(install.remove)
        stack.callback(
            cluster.kubectl,
            "delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False,
        )  # fmt: skip
        install.install(PREVIOUS)
        server = stack.enter_context(PostgresServer(address=GATEWAY, clients=CLUSTER_CIDR))
        workload = upgrade_workload(previous, server.dsn())
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(workload))
        steps = UpgradeSteps(cluster, namespace, tmp_path)
        before = wait_for(
            steps.settled, timeout=300, message="N-1 never placed and served the samples"
        )
        operator_up = steps.run(
            "operator N-1 → N",
            lambda: install.upgrade(VERSION),
            lambda: runs_through_a_window(cluster, VERSION),
        )
        workers_up = (
            steps.run(
                "workers N-1 → N",
                lambda: steps.roll_workers(DEMO_IMAGE),
                lambda: wait_for(steps.settled, timeout=300, message="never served after the roll"),
                lambda: time.sleep(TRAFFIC_WINDOW),
            )
            if installer == "Helm"
            else None
        )
        operator_back = steps.run(
            "operator N → N-1",
            install.roll_back,
            lambda: runs_through_a_window(cluster, PREVIOUS),
        )
        writers = fenced_writers(server.dsn())
        timed_out = [
            e
            for e in json.loads(
                cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
            )["items"]
            if e["reason"] == "HandoffTimedOut"
        ]
    steps_in_order = [s for s in (operator_up, workers_up, operator_back) if s is not None]
    for sample in UPGRADED_SETS:
        ref = sample.ref
        owners = {unit: state.owner for unit, state in before[ref].units.items()}
        epochs = [t.epoch for step in steps_in_order for t in step.tables[ref]]
        assert epochs == sorted(epochs), (ref, epochs)
        assert epochs[0] >= before[ref].epoch
        for step in (operator_up, operator_back):
            first = step.tables[ref][0]
            moved = {
                (unit, t.epoch)
                for t in step.tables[ref]
                for unit, state in t.units.items()
                if state != first.units[unit]
            }
            assert not moved, (ref, step.name, moved)
            assert step.changes[ref] == [], (ref, step.name, step.changes[ref])
        if workers_up is not None:
            # While a replaced pod is away its units wait for it, unowned; never on a sibling.
            elsewhere = {
                (unit, state.owner, t.epoch)
                for t in workers_up.tables[ref]
                for unit, state in t.units.items()
                if state.owner not in (None, owners[unit])
            }
            assert not elsewhere, (ref, elsewhere)
            assert {u: s.owner for u, s in workers_up.tables[ref][-1].units.items()} == owners
            # Each new worker acquired its own pod's units back, dropped none without a hand-off.
            changes = workers_up.changes[ref]
            assert changes, f"the rolled workers of {ref} logged no acquire"
            assert all(
                o.action in ("acquire", "release") and owners[o.unit] == o.pod for o in changes
            ), changes
        wrote = writers.get(ref, set())
        assert wrote, f"no write of {ref} reached the store"
        assert {(unit, owners[unit]) for unit, _ in wrote} == wrote
    assert not timed_out, [e["message"] for e in timed_out]
    for step in steps_in_order:
        assert step.refused == [], (step.name, step.refused)
        assert step.traffic["ok"] > 0, step
        assert step.traffic["failed"] == 0, step
    for step in (operator_up, operator_back):
        assert step.traffic["unavailable"] == step.traffic["redirected"] == 0, step
        assert step.traffic["unreachable"] == step.traffic["unrouted"] == 0, step
    for step in steps_in_order:
        versions = ", ".join(f"{ref} {len(tables)}" for ref, tables in step.tables.items())
        print(
            f"\n{installer}: {step.name} under traffic: table versions {versions}; "
            f"{step.traffic['ok']} requests ok; while units waited for their pods "
            f"{step.traffic['unavailable']} unavailable, {step.traffic['unrouted']} unrouted, "
            f"{step.traffic['unreachable']} unreachable; 0 failed, 0 writes refused"
        )


@dataclass
class Step:
    """What one upgrade step did to each set (by `Kind/name`): every table version published
    meanwhile and the ownership changes its workers logged; and the writes the fence refused and
    the traffic."""

    name: str
    tables: dict[str, list[AssignmentTable]]
    changes: dict[str, list[Ownership]]
    refused: list[str]
    traffic: Counter[str]


class UpgradeSteps:
    """Runs the upgrade's steps one after another on `UPGRADED_SETS`, watching each."""

    def __init__(self, cluster: DevCluster, namespace: str, tmp_path: Path) -> None:
        self.cluster, self.namespace, self.tmp_path = cluster, namespace, tmp_path

    def settled(self) -> dict[str, AssignmentTable] | None:
        """Each set's table, once every unit has an owner that serves it, and requests get
        through."""
        found = {}
        for sample in UPGRADED_SETS:
            table = read_table(self.cluster.kubectl, self.namespace, sample.kind, sample.name)
            if table is None or any(s.owner is None or s.releasing for s in table.units.values()):
                return None
            served = {
                o.unit
                for pod, text in worker_logs(self.cluster, self.namespace, sample).items()
                for o in ownership_lines(text, pod, sample.ref)
            }
            if len(served) != table.count:
                return None
            found[sample.ref] = table
        return found if traffic_since(self.cluster, self.namespace, 0)["ok"] > 0 else None

    def roll_workers(self, image: str) -> None:
        """Every set's workers rolled to `image`, one StatefulSet after the other."""
        for sample in UPGRADED_SETS:
            workers = f"statefulset/{sample.workers}"
            self.cluster.kubectl("set", "image", "-n", self.namespace, workers, f"*={image}")
            self.cluster.kubectl(
                "rollout", "status", "-n", self.namespace, workers, "--timeout=300s",
                timeout=320,
            )  # fmt: skip
            pods = worker_pods(self.cluster, self.namespace, sample)
            assert pods
            assert {p["spec"]["containers"][0]["image"] for p in pods} == {image}

    def _out(self) -> Path:
        return self.tmp_path / f"tables-{secrets.token_hex(3)}.json"

    def run(self, name: str, *actions: Callable[[], object]) -> Step:
        began = time.time()
        watches = {
            s.ref: ObjectWatch(self.cluster, self.namespace, "configmap", s.table, self._out())
            for s in UPGRADED_SETS
        }
        try:
            for act in actions:
                act()
        finally:
            versions = {ref: watch.stop() for ref, watch in watches.items()}
        # Read before the next step: a rolled worker's log goes with its pod.
        logs = {s.ref: worker_logs(self.cluster, self.namespace, s) for s in UPGRADED_SETS}
        return Step(
            name,
            tables={s.ref: decoded(s, versions[s.ref]) for s in UPGRADED_SETS},
            changes={
                ref: [
                    o
                    for pod, text in texts.items()
                    for o in ownership_lines(text, pod, ref)
                    if o.time >= began
                ]
                for ref, texts in logs.items()
            },
            refused=[
                line
                for texts in logs.values()
                for text in texts.values()
                for line in text.splitlines()
                if " refused unit=" in line
            ],
            traffic=traffic_since(self.cluster, self.namespace, began),
        )


def fenced_writers(dsn: str) -> dict[str, set[tuple[str, str]]]:
    """Set (`Kind/name`) → every (unit, pod) of the last write the store took of each key."""
    found: dict[str, set[tuple[str, str]]] = {}
    with psycopg.connect(dsn) as conn:
        for scope, unit, pod in conn.execute(
            "SELECT DISTINCT scope, unit, pod FROM apportion_demo_requests"
        ):
            kind, _namespace, name, _uid = scope.split("/")
            found.setdefault(f"{kind}/{name}", set()).add((unit, pod))
    return found
