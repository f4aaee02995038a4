"""The kubeconfig every client of the dev-cluster uses (kubectl, kopf, lightkube, the
controller-manager, simulated pods)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from apportion_dev.devcluster.pki import KeyPair

CONTEXT = "apportion-dev"


def kubeconfig_dict(
    server: str,
    token: str,
    ca_file: Path,
    namespace: str = "default",
    user: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A kubeconfig that trusts the cluster's CA, so TLS is verified rather than skipped; the
    user is the admin token unless `user` says otherwise (a client certificate)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CONTEXT, "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": f"{CONTEXT}-admin", "user": user or {"token": token}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": f"{CONTEXT}-admin", "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: Path, server: str, token: str, ca_file: Path) -> Path:
    return write_user_kubeconfig(path, server, ca_file, {"token": token})


def write_client_cert_kubeconfig(path: Path, server: str, ca_file: Path, pair: KeyPair) -> Path:
    """A kubeconfig for a component that proves who it is with its own client certificate."""
    user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    return write_user_kubeconfig(path, server, ca_file, user)


def write_user_kubeconfig(
    path: Path, server: str, ca_file: Path, user: dict[str, str], namespace: str = "default"
) -> Path:
    """A kubeconfig for `user` (its kubeconfig `user` entry), written with write_private."""
    config = kubeconfig_dict(server, "", ca_file, namespace=namespace, user=user)
    write_private(path, yaml.safe_dump(config, sort_keys=False))
    return path


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only and replaced atomically, so a client
    re-reading a credential never sees half of it or a moment of wider permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    partial.replace(path)
