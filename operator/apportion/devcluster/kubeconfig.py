"""The kubeconfig every client of the dev-cluster uses (kubectl, kopf, lightkube, the
controller-manager, simulated pods)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from apportion.devcluster.pki import KeyPair

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
    path.write_text(yaml.safe_dump(kubeconfig_dict(server, token, ca_file), sort_keys=False))
    path.chmod(0o600)
    return path


def write_client_cert_kubeconfig(path: Path, server: str, ca_file: Path, pair: KeyPair) -> Path:
    """A kubeconfig for a component that proves who it is with its own client certificate."""
    user = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    config = kubeconfig_dict(server, "", ca_file, user=user)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
