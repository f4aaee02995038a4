"""The kubeconfig every client of the dev-cluster uses (kubectl, kopf, lightkube, the
controller-manager, simulated pods)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CONTEXT = "apportion-dev"


def kubeconfig_dict(
    server: str, token: str, ca_file: Path, namespace: str = "default"
) -> dict[str, Any]:
    """A kubeconfig that trusts the API server's own self-signed CA (the serving cert file holds
    the CA after the leaf), so TLS is verified rather than skipped."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CONTEXT, "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": f"{CONTEXT}-admin", "user": {"token": token}}],
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
