"""The kubelet's projected service-account token, for process pods.

A real pod talks to the API server as its ServiceAccount with a token the kubelet requests
through the TokenRequest API, bound to the Pod (so it dies with the pod) and rotated before it
expires. A process pod gets the same: a bound token in a file next to its log, re-requested at
80 % of its lifetime as the kubelet does, and a kubeconfig holding it, which clients follow
through the rotation (see write_credentials). The process then has its ServiceAccount's RBAC
and nothing more, which is what lets the e2e suite prove a worker needs no more than the
`apportion-worker` role.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ServiceAccount

from apportion_dev.devcluster.kubeconfig import write_private, write_user_kubeconfig

# The kubelet's default for projected tokens (an hour and 7 seconds, so that a token's age
# tells the API server it came from a kubelet).
TOKEN_SECONDS = 3607
REFRESH_AT = 0.8


def mounts_token(pod: Mapping[str, Any]) -> bool:
    """Whether the pod gets API credentials: `automountServiceAccountToken: false` opts out."""
    return pod.get("spec", {}).get("automountServiceAccountToken") is not False


def account_of(pod: Mapping[str, Any]) -> str:
    return pod.get("spec", {}).get("serviceAccountName") or "default"


@dataclass(frozen=True)
class Cluster:
    """Where a pod's kubeconfig points: the API server and the CA that signed its certificate."""

    server: str
    ca_file: str

    @classmethod
    def from_kubeconfig(cls, path: str) -> Cluster:
        context = KubeConfig.from_file(path).get()
        if context is None:
            raise ValueError(f"{path}: no current context")
        cluster = context.cluster
        if cluster.certificate_auth is None:
            raise ValueError(f"{path}: the cluster names no certificate-authority file")
        return cls(cluster.server, cluster.certificate_auth)


async def issue_token(client: AsyncClient, pod: Mapping[str, Any]) -> str:
    """A token for the pod's ServiceAccount, bound to the pod. Raises ApiError (404 when the
    ServiceAccount does not exist), which the kubelet reports as a failed volume mount."""
    meta = pod["metadata"]
    request = ServiceAccount.Token(
        metadata=ObjectMeta(),
        spec=TokenRequestSpec(
            audiences=[],
            expirationSeconds=TOKEN_SECONDS,
            boundObjectRef=BoundObjectReference(
                apiVersion="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
            ),
        ),
    )
    issued = await client.create(request, account_of(pod), namespace=meta["namespace"])
    if issued.status is None or issued.status.token is None:
        raise ValueError(f"TokenRequest for {account_of(pod)} answered without a token")
    return issued.status.token


def write_credentials(
    cluster: Cluster, directory: Path, pod_name: str, namespace: str, token: str
) -> Path:
    """POD.token and POD.kubeconfig in `directory`, private and each replaced atomically. The
    kubeconfig carries the token both inline and as `tokenFile`: lightkube and client-go re-read
    the file, while fabric8 ignores `tokenFile` and reloads the whole kubeconfig when a request
    comes back 401. Returns the kubeconfig's path."""
    token_file = directory / f"{pod_name}.token"
    write_private(token_file, token)
    user = {"token": token, "tokenFile": str(token_file)}
    return write_user_kubeconfig(
        directory / f"{pod_name}.kubeconfig", cluster.server, Path(cluster.ca_file), user, namespace
    )
