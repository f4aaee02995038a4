"""Helpers of tests/e2e/test_flux.py: `GitOps` ties one Git repository to a GitRepository +
Kustomization pair in a test namespace, commits manifests to it and measures commit → Ready.

The fixture `flux` (source-controller and kustomize-controller as host processes against the
session's dev-cluster, apportion_dev.devcluster.flux) is in test_flux.py, `git_server` (a
loopback smart-HTTP Git server in the test process, apportion_dev.gitserver) in conftest.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import yaml

from apportion_dev.devcluster.flux import Flux
from apportion_dev.gitserver import GitServer, Repository
from tests.support.gitops import DEPLOY, commit_deploy

SOURCE_API = "source.toolkit.fluxcd.io/v1"
KUSTOMIZE_API = "kustomize.toolkit.fluxcd.io/v1"


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for found in obj.get("status", {}).get("conditions", []):
        if found["type"] == type_:
            return found
    return {}


class GitOps:
    """A Git repository whose `deploy/` a Kustomization applies into `namespace`."""

    def __init__(
        self,
        flux: Flux,
        git_server: GitServer,
        namespace: str,
        *,
        kustomization_interval: str = "5s",
        name: str = "app",
    ) -> None:
        self.flux, self.namespace, self.name = flux, namespace, name
        self.kubectl: Callable[..., Any] = flux.cluster.kubectl
        self.repo: Repository = git_server.create(f"{namespace}-{name}")
        self.url = git_server.url(f"{namespace}-{name}")
        self.kustomization_interval = kustomization_interval
        self.sha = ""

    def objects(self) -> list[dict[str, Any]]:
        meta = {"name": self.name, "namespace": self.namespace}
        return [
            {
                "apiVersion": SOURCE_API,
                "kind": "GitRepository",
                "metadata": meta,
                # Commits are picked up at once by `reconcile_source`; the poll is a fallback.
                "spec": {"interval": "1m", "url": self.url, "ref": {"branch": "main"}},
            },
            {
                "apiVersion": KUSTOMIZE_API,
                "kind": "Kustomization",
                "metadata": meta,
                "spec": {
                    # Every interval kustomize-controller applies the same revision again: its
                    # drift detection (a server-side apply dry run against the live objects).
                    "interval": self.kustomization_interval,
                    "retryInterval": "2s",
                    "timeout": "90s",
                    "path": f"./{DEPLOY}",
                    "prune": True,
                    "wait": True,
                    "targetNamespace": self.namespace,
                    "sourceRef": {"kind": "GitRepository", "name": self.name},
                },
            },
        ]

    def install(self) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.objects()))

    def uninstall(self) -> None:
        """Delete the Kustomization (pruning what it applied) and the GitRepository while the
        namespace and its workloads still exist: deleted with its namespace, a Kustomization
        in the middle of a health check (`wait: true`) would hold its finalizer until the
        check's timeout, the workloads being gone."""
        self.kubectl(
            "delete",
            "-n",
            self.namespace,
            "kustomization,gitrepository",
            self.name,
            "--timeout=60s",
        )

    def commit(self, manifests: dict[str, list[dict[str, Any]]], message: str) -> str:
        """Commit `manifests` as `deploy/` (tests.support.gitops.commit_deploy) and trigger the
        GitRepository."""
        self.sha = commit_deploy(self.repo, manifests, message)
        if (
            self.kubectl(
                "get", "-n", self.namespace, "gitrepository", self.name, check=False
            ).returncode
            == 0
        ):
            self.reconcile_source()
        return self.sha

    def reconcile_source(self) -> None:
        self.flux.reconcile_now("gitrepository", self.namespace, self.name)

    def reconcile(self) -> None:
        """Reconcile the Kustomization now (same revision: a drift check)."""
        self.flux.reconcile_now("kustomization", self.namespace, self.name)

    def kustomization(self) -> dict[str, Any]:
        return self.flux.get("kustomization", self.namespace, self.name)

    def ready_at(self, sha: str) -> dict[str, Any] | None:
        """The Kustomization once it applied `sha` and is Ready (health checks passed)."""
        obj = self.kustomization()
        status = obj.get("status", {})
        ready = condition(obj, "Ready")
        return (
            obj
            if ready.get("status") == "True"
            and status.get("lastAppliedRevision", "").endswith(sha)
            and status.get("observedGeneration") == obj["metadata"]["generation"]
            else None
        )

    def wait_ready(self, sha: str, wait_for: Callable[..., Any], timeout: float = 120) -> float:
        """Seconds from now until the Kustomization is Ready at `sha`."""
        started = time.monotonic()
        wait_for(
            lambda: self.ready_at(sha),
            timeout,
            f"Kustomization not Ready at {sha}: {json.dumps(self.kustomization().get('status'))}",
        )
        return time.monotonic() - started


def apply_results(log: str, namespace: str) -> list[dict[str, str]]:
    """The per-object outcomes ("created", "configured", "unchanged", ...) of every server-side
    apply kustomize-controller logged for Kustomizations in `namespace`, in order."""
    results = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        output = entry.get("output")
        if (
            isinstance(output, dict)
            and "apply" in str(entry.get("msg", ""))
            and entry.get("namespace", namespace) == namespace
        ):
            results.append({str(k): str(v) for k, v in output.items()})
    return results
