"""The dev-cluster's certificates, checked by openssl itself: every leaf verifies against its CA
for its purpose, servers name the addresses clients use, clients carry user and groups."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from apportion_dev.devcluster import pki


@pytest.fixture(scope="module")
def cluster_pki(tmp_path_factory: pytest.TempPathFactory) -> pki.ClusterPki:
    return pki.make_cluster_pki(tmp_path_factory.mktemp("pki"), ("10.244.0.1", "10.0.0.1"))


def openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def verify(ca: pki.KeyPair, leaf: pki.KeyPair, purpose: str) -> bool:
    result = subprocess.run(
        ["openssl", "verify", "-purpose", purpose, "-CAfile", str(ca.cert), str(leaf.cert)],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0


def test_the_serving_certificate_names_every_address_clients_use(
    cluster_pki: pki.ClusterPki,
) -> None:
    assert verify(cluster_pki.ca, cluster_pki.serving, "sslserver")
    text = openssl("x509", "-in", str(cluster_pki.serving.cert), "-noout", "-ext", "subjectAltName")
    for name in ("IP Address:127.0.0.1", "IP Address:10.244.0.1", "IP Address:10.0.0.1"):
        assert name in text
    assert "DNS:kubernetes.default.svc" in text
    # a server certificate is not a client one
    assert not verify(cluster_pki.ca, cluster_pki.serving, "sslclient")


def test_client_certificates_carry_user_and_groups(cluster_pki: pki.ClusterPki) -> None:
    assert verify(cluster_pki.ca, cluster_pki.kubelet_client, "sslclient")
    subject = openssl(
        "x509",
        "-in",
        str(cluster_pki.kubelet_client.cert),
        "-noout",
        "-subject",
        "-nameopt",
        "RFC2253",
    )
    assert "CN=kube-apiserver-kubelet-client" in subject
    assert "O=system:masters" in subject
    assert not verify(cluster_pki.ca, cluster_pki.kubelet_client, "sslserver")


def test_the_front_proxy_has_a_ca_of_its_own(cluster_pki: pki.ClusterPki) -> None:
    assert verify(cluster_pki.front_proxy_ca, cluster_pki.front_proxy_client, "sslclient")
    # a front-proxy identity must not pass as a cluster user
    assert not verify(cluster_pki.ca, cluster_pki.front_proxy_client, "sslclient")


def test_keys_are_private(cluster_pki: pki.ClusterPki) -> None:
    for pair in (cluster_pki.ca, cluster_pki.serving, cluster_pki.kubelet_client):
        assert Path(pair.key).stat().st_mode & 0o077 == 0
