"""kubectl as one principal of the dev-cluster: nothing but a token, no admin credentials."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.kubeconfig import write_user_kubeconfig

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def token_kubeconfig(cluster: DevCluster, path: Path, token: str, namespace: str) -> Path:
    return write_user_kubeconfig(path, cluster.server, cluster.ca_file, {"token": token}, namespace)


def as_user(cluster: DevCluster, path: Path, namespace: str, token: str) -> Kubectl:
    """kubectl with nothing but `token` (written to the kubeconfig `path`), never raising."""
    config = token_kubeconfig(cluster, path, token, namespace)

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={config}", *args],
            input=input,
            text=True,
            capture_output=True,
            timeout=60,
        )

    return run
