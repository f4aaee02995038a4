"""The operator's in-cluster login takes the API server's address from the environment the
kubelet sets, not from cluster DNS."""

from __future__ import annotations

from pathlib import Path

from apportion.controllers.login import in_cluster


def account(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("the-token\n")
    (tmp_path / "namespace").write_text("apportion-system")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


def test_in_a_pod_the_service_address_and_token_are_used(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    info = in_cluster(env, account(tmp_path))
    assert info is not None
    assert info.server == "https://10.0.0.1:443"
    assert info.token == "the-token"
    assert info.default_namespace == "apportion-system"
    assert info.ca_path == str(tmp_path / "ca.crt")


def test_an_ipv6_service_address_is_bracketed(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    info = in_cluster(env, account(tmp_path))
    assert info is not None
    assert info.server == "https://[fd00::1]:6443"


def test_outside_a_pod_there_is_no_in_cluster_login(tmp_path: Path) -> None:
    assert in_cluster({}, account(tmp_path)) is None
    assert in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path / "absent") is None
