"""What a stored v1alpha1 object becomes when v1beta1 arrives (docs/operations.md, "API versions"),
on a dev-cluster of its own (it changes the CRDs every other module relies on), read in etcd
itself: the bytes the API server stored say which version they were written in.

The next release's CRDs are made from today's as that release will ship them: v1beta1 beside
v1alpha1 with the same schema (conversion `None`), v1beta1 the storage version."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from apportion.api import resource_kinds
from apportion_dev.devcluster import DevCluster
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
CRDS = sorted((REPO / "crds").glob("*.apportion.dev.yaml"))
SAMPLES = [
    REPO / "manifests" / "samples" / f"{kind}-demo.yaml"
    for kind in ("partitionset", "shardset", "graintype")
]
NAMESPACE = "versions"


def next_release_crd(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (alpha,) = crd["spec"]["versions"]
    beta = {**copy.deepcopy(alpha), "name": "v1beta1", "storage": True}
    crd["spec"]["versions"] = [{**alpha, "storage": False}, beta]
    return crd


def sets(path: Path) -> list[dict[str, Any]]:
    return [
        d
        for d in yaml.safe_load_all(path.read_text())
        if d and d["apiVersion"].startswith("apportion.dev/")
    ]


def stored(cluster: DevCluster, plural: str, name: str) -> dict[str, Any]:
    """The object as etcd holds it (custom resources are stored as JSON)."""
    key = f"/registry/apportion.dev/{plural}/{NAMESPACE}/{name}".encode()
    request = urllib.request.Request(
        f"{cluster.etcd}/v3/kv/range",
        data=json.dumps({"key": base64.b64encode(key).decode()}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        (kv,) = json.load(response)["kvs"]
    document: dict[str, Any] = json.loads(base64.b64decode(kv["value"]))
    return document


def apply(cluster: DevCluster, documents: list[dict[str, Any]]) -> None:
    text = "---\n".join(yaml.safe_dump(d) for d in documents)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with DevCluster.start(tmp_path_factory.mktemp("versions") / "cluster") as started:
        started.kubectl("apply", "-f", str(REPO / "crds"))
        started.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{p.stem}" for p in CRDS)
        )
        started.kubectl("create", "namespace", NAMESPACE)
        yield started


def objects() -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) of every set the samples hold."""
    kinds = resource_kinds()
    return [(kinds[d["kind"]].crd.plural, d) for path in SAMPLES for d in sets(path)]


def migrate(cluster: DevCluster) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "apportion", "crds", "--migrate-storage"],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def stored_versions(cluster: DevCluster) -> dict[str, list[str]]:
    return {
        path.stem: json.loads(
            cluster.kubectl(
                "get", f"crd/{path.stem}", "-o", "jsonpath={.status.storedVersions}"
            ).stdout
        )
        for path in CRDS
    }


def test_a_stored_v1alpha1_object_is_rewritten_in_v1beta1_and_only_then_can_v1alpha1_go(
    cluster: DevCluster,
) -> None:
    written = objects()
    apply(
        cluster, [{**d, "metadata": {**d["metadata"], "namespace": NAMESPACE}} for _, d in written]
    )
    before = {
        d["metadata"]["name"]: stored(cluster, plural, d["metadata"]["name"])
        for plural, d in written
    }
    assert {o["apiVersion"] for o in before.values()} == {"apportion.dev/v1alpha1"}

    apply(cluster, [next_release_crd(path) for path in CRDS])
    for path in CRDS:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{path.stem}")
    # A new storage version rewrites nothing by itself: both versions are stored now.
    assert stored_versions(cluster) == {p.stem: ["v1alpha1", "v1beta1"] for p in CRDS}
    for plural, d in written:
        name = d["metadata"]["name"]
        assert stored(cluster, plural, name)["apiVersion"] == "apportion.dev/v1alpha1"
        served = json.loads(
            cluster.kubectl(
                "get", f"{plural}.v1beta1.apportion.dev/{name}", "-n", NAMESPACE, "-o", "json"
            ).stdout
        )
        assert served["apiVersion"] == "apportion.dev/v1beta1"
        assert served["spec"] == before[name]["spec"]
    # Dropping v1alpha1 now would strand what etcd still holds in it: the API server refuses.
    only_beta = [
        {**c, "spec": {**c["spec"], "versions": c["spec"]["versions"][1:]}}
        for c in map(next_release_crd, CRDS)
    ]
    refused = cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        input="---\n".join(yaml.safe_dump(c) for c in only_beta),
        check=False,
    )
    assert refused.returncode != 0
    assert "storedVersions" in refused.stderr

    report = migrate(cluster)
    for path in CRDS:
        assert f"{path.stem}: " in report
        assert "-> [v1beta1]" in report
    assert stored_versions(cluster) == {p.stem: ["v1beta1"] for p in CRDS}
    for plural, d in written:
        name = d["metadata"]["name"]
        after = stored(cluster, plural, name)
        assert after["apiVersion"] == "apportion.dev/v1beta1"
        assert after["spec"] == before[name]["spec"]
        # The rewrite is no new intent: the operator keys its passes on generation.
        assert after["metadata"]["generation"] == before[name]["metadata"]["generation"]
    assert "nothing to do" in migrate(cluster)

    apply(cluster, only_beta)
    wait_for(
        lambda: all(
            [
                v["name"]
                for v in json.loads(cluster.kubectl("get", f"crd/{p.stem}", "-o", "json").stdout)[
                    "spec"
                ]["versions"]
            ]
            == ["v1beta1"]
            for p in CRDS
        ),
        timeout=30,
        message="v1alpha1 never left the CRDs",
    )
    for plural, d in written:
        name = d["metadata"]["name"]
        served = json.loads(
            cluster.kubectl(
                "get", f"{plural}.apportion.dev/{name}", "-n", NAMESPACE, "-o", "json"
            ).stdout
        )
        assert served["spec"] == before[name]["spec"]
