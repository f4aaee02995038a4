"""What the GitOps tests of both engines share (tests.support.flux, tests.support.argocd): the
repository layout they apply (`deploy/` with a kustomization.yaml, docs/gitops.md), the
PartitionSet sample as it goes into Git, and watching one object's every version."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from apportion_dev.gitserver import Repository

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = "deploy"


def commit_deploy(
    repo: Repository,
    manifests: dict[str, list[dict[str, Any]]],
    message: str,
    path: str = DEPLOY,
) -> str:
    """Make `path` hold exactly `manifests` (file name → objects) plus a kustomization.yaml
    listing them, commit and push; the commit's sha."""
    directory = repo.work / path
    if directory.exists():
        for old in directory.iterdir():
            old.unlink()
    for file, objects in manifests.items():
        repo.write(f"{path}/{file}", yaml.safe_dump_all(objects))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": sorted(manifests),
    }
    repo.write(f"{path}/kustomization.yaml", yaml.safe_dump(kustomization))
    return repo.commit(message)


def sample(replicas: int, partitions: int | None) -> dict[str, list[dict[str, Any]]]:
    """manifests/samples/partitionset-demo.yaml with `replicas` workers and `partitions`
    partitions (without the PartitionSet for None), as one file."""
    text = (REPO_ROOT / "manifests" / "samples" / "partitionset-demo.yaml").read_text()
    kept = []
    for obj in (o for o in yaml.safe_load_all(text) if o):
        if obj["kind"] == "StatefulSet":
            obj["spec"]["replicas"] = replicas
        if obj["kind"] == "PartitionSet":
            if partitions is None:
                continue
            obj["spec"]["partitions"] = partitions
            obj["spec"]["keyScheme"] = "apportion"  # partitions may change (split) only then
        kept.append(obj)
    return {"app.yaml": kept}


def balanced(
    kubectl: Callable[..., Any], namespace: str, name: str, members: int
) -> dict[str, Any] | None:
    """The PartitionSet once settled over `members` pods: its spec observed, no move under way,
    Balanced."""
    obj: dict[str, Any] = json.loads(
        kubectl("get", "-n", namespace, "pset", name, "-o", "json").stdout
    )
    status = obj.get("status", {})
    settled = (
        status.get("members") == members
        and status.get("movesInProgress") == 0
        and status.get("observedGeneration") == obj["metadata"]["generation"]
        and any(
            c["type"] == "Balanced" and c["status"] == "True" for c in status.get("conditions", [])
        )
    )
    return obj if settled else None


def managers(obj: dict[str, Any]) -> list[tuple[str, str, str, list[str]]]:
    """(manager, operation, subresource, top-level fields) of every managedFields entry."""
    return sorted(
        (
            entry["manager"],
            entry["operation"],
            entry.get("subresource", ""),
            sorted(entry.get("fieldsV1", {})),
        )
        for entry in obj["metadata"].get("managedFields", [])
    )


class ObjectWatch:
    """`kubectl get --watch` of one object: every version the API server sends, in order."""

    def __init__(self, cluster: Any, namespace: str, kind: str, name: str, out: Path) -> None:
        self.out = out
        self._file = out.open("w")
        self.process = subprocess.Popen(
            [
                str(cluster.bin_dir / "kubectl"),
                f"--kubeconfig={cluster.kubeconfig}",
                "get",
                "-n",
                namespace,
                kind,
                name,
                "--watch",
                "-o",
                "json",
            ],
            stdout=self._file,
            stderr=subprocess.DEVNULL,
            env=cluster.env,
        )

    def stop(self) -> list[dict[str, Any]]:
        self.process.terminate()
        self.process.wait(timeout=10)
        self._file.close()
        text, decoder, at = self.out.read_text(), json.JSONDecoder(), 0
        versions: list[Any] = []
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                return versions
            obj, at = decoder.raw_decode(text, at)
            versions.append(obj)
