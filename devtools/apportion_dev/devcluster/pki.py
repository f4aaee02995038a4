"""The dev-cluster's certificates: one CA, the API server's serving certificate, and client
certificates for whoever must prove who it is without a token (the API server to the kubelet,
and the API server to an aggregated API such as metrics-server, through the front proxy).

With a CA of our own, the serving certificate names every address a client uses (loopback, the
real node's bridge address, the `kubernetes` Service IP and its DNS names), so in-cluster clients
verify TLS exactly as on a real cluster. Keys are ECDSA P-256: fast to make at every start. The
`openssl` command line makes them, as for the service-account key.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from apportion_dev.devcluster.paths import DevClusterError

VALID_DAYS = 3650
SERVICE_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _openssl(*args: str, stdin: str | None = None) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise DevClusterError("`openssl` is not on PATH; it makes the dev-cluster's certificates")
    result = subprocess.run(
        [openssl, *args], input=stdin, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise DevClusterError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _new_key(path: Path) -> None:  # fmt: skip
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)
    )
    path.chmod(0o600)


def make_ca(directory: Path, name: str) -> KeyPair:
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    _openssl(
        "req", "-x509", "-new", "-key", str(pair.key), "-out", str(pair.cert),
        "-days", str(VALID_DAYS), "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    return pair


def issue(
    ca: KeyPair,
    directory: Path,
    name: str,
    *,
    common_name: str,
    organizations: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
) -> KeyPair:
    """A leaf certificate signed by `ca`: a server certificate when it names addresses, else a
    client certificate whose CN is the user and whose O entries are its groups."""
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    subject = "/CN=" + common_name + "".join(f"/O={o}" for o in organizations)
    request = directory / f"{name}.csr"
    _openssl("req", "-new", "-key", str(pair.key), "-out", str(request), "-subj", subject)
    alt_names = [f"IP:{ip}" for ip in ips] + [f"DNS:{dns}" for dns in dns_names]
    usage = "serverAuth" if alt_names else "clientAuth"
    extensions = directory / f"{name}.ext"
    extensions.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage={usage}\n"
        + (f"subjectAltName={','.join(alt_names)}\n" if alt_names else "")
    )
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(pair.cert), "-days", str(VALID_DAYS),
        "-extfile", str(extensions),
    )  # fmt: skip
    request.unlink()
    extensions.unlink()
    return pair


@dataclass(frozen=True)
class ClusterPki:
    ca: KeyPair
    serving: KeyPair
    kubelet_client: KeyPair  # the API server, to kubelets (logs, exec, port-forward)
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair  # the API server, to aggregated APIs

    def apiserver_flags(self) -> list[str]:
        return [
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.cert}",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca.cert}",
            f"--requestheader-client-ca-file={self.front_proxy_ca.cert}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client.cert}",
            f"--proxy-client-key-file={self.front_proxy_client.key}",
        ]


def make_cluster_pki(directory: Path, server_ips: tuple[str, ...]) -> ClusterPki:
    """Every certificate a cluster needs; `server_ips` are the addresses the API server answers
    on (loopback or the node's bridge address, and the `kubernetes` Service IP)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory, "ca")
    front_proxy_ca = make_ca(directory, "front-proxy-ca")
    return ClusterPki(
        ca=ca,
        serving=issue(
            ca,
            directory,
            "apiserver",
            common_name="kube-apiserver",
            ips=tuple(dict.fromkeys(("127.0.0.1", *server_ips))),
            dns_names=SERVICE_DNS_NAMES,
        ),
        kubelet_client=issue(
            ca,
            directory,
            "apiserver-kubelet-client",
            common_name="kube-apiserver-kubelet-client",
            organizations=("system:masters",),
        ),
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=issue(
            front_proxy_ca, directory, "front-proxy-client", common_name="front-proxy-client"
        ),
    )
