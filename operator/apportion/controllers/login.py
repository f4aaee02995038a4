"""How the operator logs in to the API server.

In a pod: the address from KUBERNETES_SERVICE_HOST/PORT and the pod's ServiceAccount token, as
client-go's in-cluster config and lightkube do. kopf's own service-account login asks DNS for
`kubernetes.default.svc` instead, which fails on a cluster without cluster DNS (the dev-cluster's
real node has none) and is one more moving part on any cluster. Elsewhere: the kubeconfig, as
kopf does. kopf calls this again when a token is refused, so a rotated token is picked up.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path
from typing import Any

import kopf

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return in_cluster(os.environ, SERVICE_ACCOUNT) or kopf.login_with_kubeconfig(**kwargs)


def in_cluster(environ: Any, account: Path) -> kopf.ConnectionInfo | None:
    host = environ.get("KUBERNETES_SERVICE_HOST")
    token = account / "token"
    if not host or not token.exists():
        return None
    with contextlib.suppress(ValueError):  # a name is used as it is
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    namespace = account / "namespace"
    ca = account / "ca.crt"
    return kopf.ConnectionInfo(
        server=f"https://{host}:{environ.get('KUBERNETES_SERVICE_PORT', '443')}",
        ca_path=str(ca) if ca.exists() else None,
        token=token.read_text().strip(),
        default_namespace=namespace.read_text().strip() if namespace.exists() else None,
    )
