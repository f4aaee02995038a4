"""Helpers of tests/e2e/test_argocd.py: `ArgoApp` ties one Git repository to an Application
rendered from the shipped manifests/argocd/application.yaml, and reads what Argo CD reports.

The fixture `argocd` (Redis and Argo CD's repo-server, application-controller and
applicationset-controller as host processes, apportion_dev.devcluster.argocd) is in
test_argocd.py, `git_server` in conftest.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml

from apportion_dev.devcluster.argocd import NAMESPACE, ArgoCD
from apportion_dev.gitserver import GitServer
from tests.support.gitops import REPO_ROOT, commit_deploy

SHIPPED = REPO_ROOT / "manifests" / "argocd"


def shipped(file: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SHIPPED / file).read_text())
    return loaded


def resource(app: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    """The Application's record of one object it manages (sync status and health), or {}."""
    for found in app.get("status", {}).get("resources", []):
        if found["kind"] == kind and found["name"] == name:
            return dict(found)
    return {}


def sync_status(app: dict[str, Any]) -> str:
    return str(app.get("status", {}).get("sync", {}).get("status", ""))


def health_status(app: dict[str, Any]) -> str:
    return str(app.get("status", {}).get("health", {}).get("status", ""))


def synced_at(app: dict[str, Any], sha: str) -> bool:
    """Argo CD compared the live objects with `sha` and found them all as Git says, and its last
    sync (automated) applied `sha` and is done."""
    status = app.get("status", {})
    operation = status.get("operationState", {})
    return (
        sync_status(app) == "Synced"
        and status.get("sync", {}).get("revision") == sha
        and operation.get("phase") == "Succeeded"
        and operation.get("syncResult", {}).get("revision") == sha
    )


class ArgoApp:
    """A Git repository whose `deploy/` the shipped Application syncs into `namespace`; the
    Application is named after the namespace (Applications share Argo CD's namespace)."""

    def __init__(self, argocd: ArgoCD, git_server: GitServer, namespace: str) -> None:
        self.argocd, self.namespace, self.name = argocd, namespace, namespace
        self.kubectl: Callable[..., Any] = argocd.cluster.kubectl
        self.repo = git_server.create(namespace)
        self.url = git_server.url(namespace)
        self.installed = False
        self.figures: dict[str, Any] = {}

    def manifest(self) -> dict[str, Any]:
        app = shipped("application.yaml")
        app["metadata"]["name"] = self.name
        app["spec"]["source"]["repoURL"] = self.url
        app["spec"]["destination"]["namespace"] = self.namespace
        return app

    def install(self) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(self.manifest()))
        self.installed = True

    def commit(self, manifests: dict[str, list[dict[str, Any]]], message: str) -> str:
        """Commit `manifests` as `deploy/`; an installed Application looks at Git at once."""
        sha = commit_deploy(self.repo, manifests, message)
        if self.installed:
            self.argocd.refresh(self.name)
        return sha

    def get(self) -> dict[str, Any]:
        return self.argocd.application(self.name)

    def wait(
        self,
        sha: str,
        health: str,
        wait_for: Callable[..., Any],
        timeout: float = 120,
    ) -> dict[str, Any]:
        """The Application once it is synced at `sha` with the health `health`."""

        def reached() -> dict[str, Any] | None:
            app = self.get()
            return app if synced_at(app, sha) and health_status(app) == health else None

        found: dict[str, Any] = wait_for(
            reached,
            timeout,
            lambda: f"not synced and {health} at {sha}: {json.dumps(self.get().get('status'))}",
        )
        return found

    def delete(self) -> None:
        """Delete the Application; its finalizer has Argo CD delete what it applied first."""
        self.kubectl(
            "delete", "-n", NAMESPACE, "application", self.name, "--timeout=120s", check=False
        )
        self.installed = False
