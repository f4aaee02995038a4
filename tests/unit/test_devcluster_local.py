"""Pure and local pieces of the dev-cluster harness: ports, credentials, kubeconfig, state
directory, environment, and process supervision (with a local `sleep`, no cluster)."""

from __future__ import annotations

import socket
import stat
import sys
import time
from pathlib import Path

import pytest
import yaml
from lightkube import KubeConfig

from apportion_dev.devcluster import processes
from apportion_dev.devcluster.cluster import cluster_env
from apportion_dev.devcluster.credentials import token_auth_line
from apportion_dev.devcluster.kubeconfig import write_kubeconfig
from apportion_dev.devcluster.net import free_port, free_ports
from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.processes import ProcessRecord
from apportion_dev.devcluster.state import (
    MARKER,
    ClusterState,
    Layout,
    claim,
    load_state,
    release,
    save_state,
)
from tests.support.present import present


def test_free_ports_are_distinct_loopback_ports_we_can_bind() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in [*ports, free_port()]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_token_file_line_puts_admin_in_system_masters() -> None:
    assert token_auth_line("abc") == 'abc,admin,admin-uid,"system:masters"\n'


def test_kubeconfig_verifies_tls_with_the_api_server_ca(tmp_path: Path) -> None:
    path = write_kubeconfig(
        tmp_path / "kubeconfig", "https://127.0.0.1:6443", "tok", tmp_path / "ca.crt"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = yaml.safe_load(path.read_text())
    assert "insecure-skip-tls-verify" not in raw["clusters"][0]["cluster"]
    config = present(KubeConfig.from_file(path).get(), "the current context")
    assert config.cluster.server == "https://127.0.0.1:6443"
    assert config.cluster.certificate_auth == str(tmp_path / "ca.crt")
    assert present(config.user, "the user").token == "tok"
    assert config.namespace == "default"


def test_cluster_env_puts_kubeconfig_and_kubectl_first() -> None:
    env = cluster_env({"PATH": "/usr/bin", "HOME": "/h"}, Path("/s/kubeconfig"), Path("/bin/k8s"))
    assert env == {"PATH": "/bin/k8s:/usr/bin", "HOME": "/h", "KUBECONFIG": "/s/kubeconfig"}


def test_state_round_trips_and_is_private(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "dc")
    claim(layout)
    state = ClusterState(
        server="https://127.0.0.1:1",
        token="t",
        bin_dir="/b",
        processes=[ProcessRecord("etcd", 12, 34, "/l/etcd.log")],
    )
    save_state(layout, state)
    assert load_state(layout) == state
    assert stat.S_IMODE(layout.state_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.root.stat().st_mode) == 0o700
    assert layout.pod_log("ns", "p") == layout.root / "pods" / "ns" / "p.log"


def test_claim_refuses_a_foreign_directory_and_release_only_removes_ours(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("precious")
    with pytest.raises(DevClusterError, match="not empty"):
        claim(Layout(foreign))
    release(Layout(foreign))
    assert (foreign / "notes.txt").exists()

    ours = Layout(tmp_path / "ours")
    claim(ours)
    assert (ours.root / MARKER).exists()
    (ours.logs / "etcd.log").write_text("x")
    claim(ours)  # a leftover dev-cluster directory is taken over, fresh
    assert not (ours.logs / "etcd.log").exists()
    release(ours)
    assert not ours.root.exists()


def test_processes_are_tracked_and_terminated(tmp_path: Path) -> None:
    record = processes.spawn("sleeper", ["sleep", "30"], tmp_path / "sleep.log")
    assert processes.is_running(record)
    # The same pid with another start time is someone else's process.
    assert not processes.is_running(
        ProcessRecord(record.name, record.pid, record.start_time + 1, record.log)
    )
    processes.terminate([record], grace=5)
    assert not processes.is_running(record)


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(30)"
    )
    record = processes.spawn("stubborn", [sys.executable, "-c", script], tmp_path / "s.log")
    deadline = time.monotonic() + 10
    while "up" not in Path(record.log).read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    processes.terminate([record], grace=0.5)
    assert not processes.is_running(record)
