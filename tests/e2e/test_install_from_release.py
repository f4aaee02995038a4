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
from apportion_dev.devcluster.flux import Flux
from apportion_dev.devcluster.realnode.host import CLUSTER_CIDR, GATEWAY
from apportion_dev.gitserver import GitServer
from tests.support import release
from tests.support.flux import KUSTOMIZE_API, SOURCE_API, condition
from tests.support.gitops import ObjectWatch
from tests.support.postgres import PostgresServer
from tests.support.unitset import ownership_lines, read_table
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


def operator_pods(cluster: DevCluster) -> list[dict[str, Any]]:
    listing = cluster.kubectl(
        "get", "pods", "-n", SYSTEM, "-l", "app.kubernetes.io/name=apportion-operator", "-o", "json"
    )
    return list(json.loads(listing.stdout)["items"])


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
        listing = cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", "app=demo-workers", "-o", "json"
        )
        ran_from_the_registry(published, json.loads(listing.stdout)["items"], DEMO_IMAGE)
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


def flux_objects(published: Published, namespace: str, git_url: str) -> list[dict[str, Any]]:
    """The operator from the release's Flux artifact (OCIRepository), and a set from Git applied
    only once the operator's Kustomization is Ready (dependsOn), both waited for (kstatus)."""
    meta = {"namespace": namespace}
    return [
        {
            "apiVersion": SOURCE_API,
            "kind": "OCIRepository",
            "metadata": {"name": "apportion", **meta},
            "spec": {
                "url": f"oci://{published.cluster.registry}/{oci.MANIFESTS_REPOSITORY}",
                "ref": {"tag": VERSION},
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

            def ready(name: str) -> dict[str, Any] | None:
                obj = flux.get("kustomization", namespace, name)
                return obj if condition(obj, "Ready").get("status") == "True" else None

            sets = wait_for(
                lambda: ready("sets"),
                timeout=420,
                message=lambda: json.dumps(
                    {
                        n: flux.get("kustomization", namespace, n).get("status")
                        for n in SETS_AND_OPERATOR
                    }
                ),
            )
            assert sets["status"]["lastAppliedRevision"].endswith(sha)
            operator = ready("apportion-operator")
            assert operator is not None
            assert operator["status"]["lastAppliedRevision"].startswith(f"{VERSION}@sha256:")
            ran_from_the_registry(published, operator_pods(cluster), OPERATOR_IMAGE)
            # dependsOn: the set was created only after the operator's Kustomization was Ready.
            found = cluster.kubectl("get", "-n", namespace, "pset", "demo", "-o", "json")
            pset = json.loads(found.stdout)
            assert condition(pset, "Ready").get("status") == "True"
            operator_ready = condition(operator, "Ready")["lastTransitionTime"]
            assert pset["metadata"]["creationTimestamp"] >= operator_ready
        finally:
            # The set goes with its Kustomization; the operator's is told not to prune first,
            # or its CRDs, which every set of the cluster lives on, would go with it.
            flux_delete = ("delete", "-n", namespace, "--timeout=120s")
            cluster.kubectl(*flux_delete, "kustomization", "sets", check=False)
            cluster.kubectl(
                "patch", "-n", namespace, "kustomization", "apportion-operator", "--type=merge",
                "-p", json.dumps({"spec": {"prune": False}}), check=False,
            )  # fmt: skip
            cluster.kubectl(*flux_delete, "kustomization", "apportion-operator", check=False)
            cluster.kubectl(*flux_delete, "ocirepository,gitrepository", "--all", check=False)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
            remove_operator(cluster)


# N-1: the release of an earlier commit, cut by the same command (the last commit of the
# session before releases could be installed from a registry).
PREVIOUS_COMMIT = "17673fd"
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


def upgrade_workload(dist: Path, postgres: str) -> list[dict[str, Any]]:
    """The release's PartitionSet sample with every request written to PostgreSQL through the
    fence, placed by count, and its traffic generator aimed at it alone (20 requests/s)."""
    docs = [
        d
        for d in yaml.safe_load_all((dist / "samples" / "partitionset-demo.yaml").read_text())
        if d
    ]
    traffic = [
        d for d in yaml.safe_load_all((dist / "samples" / "traffic-demo.yaml").read_text()) if d
    ]
    for doc in docs:
        if doc["kind"] == "PartitionSet":
            doc["spec"]["rebalance"].update(handoffTimeout="20s")
            # Placed by count, not by the measured load: under traffic Balanced moves units
            # for the load alone, which is its business; here any move is the upgrade's.
            del doc["spec"]["metrics"]
        if doc["kind"] == "StatefulSet":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            container["env"].append({"name": "APPORTION_DEMO_POSTGRES", "value": postgres})
    for doc in traffic:
        if doc["kind"] == "ConfigMap":
            doc["data"]["rate"] = "20"
        if doc["kind"] == "Deployment":
            (container,) = doc["spec"]["template"]["spec"]["containers"]
            container["command"] = [*container["command"][:2], "--set=PartitionSet/demo"]
    return docs + traffic


def decoded(versions: list[dict[str, Any]]) -> list[AssignmentTable]:
    base = assignment_config_map("PartitionSet", "demo")
    return [decode_assignment([ConfigMapPayload.from_configmap(v, base)]) for v in versions]


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
            r"(\d+) (requests|ok|redirected|unavailable|unrouted|failed|dropped)", text
        ):
            total[what] += int(count)
    return total


def _epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def worker_logs(cluster: DevCluster, namespace: str) -> dict[str, str]:
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", "app=demo-workers", "-o", "json"
        ).stdout
    )["items"]
    return {
        p["metadata"]["name"]: cluster.kubectl(
            "logs", "-n", namespace, p["metadata"]["name"]
        ).stdout
        for p in pods
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


def test_an_operator_upgrade_and_rollback_under_traffic_move_nothing(
    published: Published, previous: Path, helm: Callable[..., Any], tmp_path: Path
) -> None:
    """N-1 places a PartitionSet whose workers write every request through the PostgreSQL fence
    under traffic; Helm upgrades the operator to N, then rolls it back to N-1. Through both, every
    table the operator publishes keeps each unit with its owner under its token (0 moves), no
    epoch goes back, no worker acquires, releases or stops a unit, no request fails and the fence
    refuses no write."""
    cluster = published.cluster
    chart = f"oci://{cluster.registry}/{oci.CHART_REPOSITORY}/apportion"
    kubeconfig = f"--kubeconfig={cluster.kubeconfig}"
    release_args = ("apportion", chart, "-n", SYSTEM, kubeconfig, "--plain-http", "--wait")
    helm(
        "install", *release_args, "--version", PREVIOUS, "--create-namespace", "--timeout=300s",
        timeout=360,
    )  # fmt: skip
    namespace = f"upgrade-{secrets.token_hex(3)}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        with PostgresServer(address=GATEWAY, clients=CLUSTER_CIDR) as server:
            workload = upgrade_workload(previous, server.dsn())
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(workload))

            def settled() -> AssignmentTable | None:
                table = read_table(cluster.kubectl, namespace, "PartitionSet", "demo")
                if table is None or any(
                    s.owner is None or s.releasing for s in table.units.values()
                ):
                    return None
                served = {
                    o.unit
                    for pod, text in worker_logs(cluster, namespace).items()
                    for o in ownership_lines(text, pod, "PartitionSet/demo")
                }
                flowing = traffic_since(cluster, namespace, 0)["ok"] > 0
                return table if len(served) == table.count and flowing else None

            before = wait_for(
                settled, timeout=300, message="N-1 never placed and served the sample"
            )
            began = time.time()
            watch = ObjectWatch(
                cluster, namespace, "configmap", assignment_config_map("PartitionSet", "demo"),
                tmp_path / "tables.json",
            )  # fmt: skip
            helm("upgrade", *release_args, "--version", VERSION, "--timeout=300s", timeout=360)
            runs_through_a_window(cluster, VERSION)
            helm(
                "rollback", "apportion", "1", "-n", SYSTEM, kubeconfig, "--wait", "--timeout=300s",
                timeout=360,
            )  # fmt: skip
            runs_through_a_window(cluster, PREVIOUS)
            tables = decoded(watch.stop())
            logs = worker_logs(cluster, namespace)
            refused = [
                line
                for text in logs.values()
                for line in text.splitlines()
                if " refused unit=" in line
            ]
            changes = [
                o
                for pod, text in logs.items()
                for o in ownership_lines(text, pod, "PartitionSet/demo")
                if o.time >= began
            ]
            traffic = traffic_since(cluster, namespace, began)
    finally:
        cluster.kubectl(
            "delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False
        )
        helm("uninstall", "apportion", "-n", SYSTEM, kubeconfig, "--wait", check=False)
        remove_operator(cluster)
    epochs = [t.epoch for t in tables]
    assert epochs == sorted(epochs), epochs
    assert epochs[0] >= before.epoch
    moved = {
        (unit, t.epoch)
        for t in tables
        for unit, state in t.units.items()
        if state != before.units[unit]
    }
    assert not moved, moved
    assert changes == [], changes
    assert refused == [], refused
    assert traffic["ok"] > 0, traffic
    assert traffic["failed"] == traffic["unavailable"] == traffic["redirected"] == 0, traffic
    print(
        f"\noperator {PREVIOUS} → {VERSION} → {PREVIOUS} under traffic: {len(tables)} table "
        f"versions watched, epochs {epochs[0]}..{epochs[-1]}, 0 units moved, "
        f"{traffic['ok']} requests ok, 0 failed, 0 writes refused"
    )
