"""Real nodes killed with SIGKILL leave running pods, mounts, cgroups, iptables chains, a bridge,
network namespaces, veth pairs, routes and changed sysctls behind; `apportion dev-cluster stop`,
or the next start, must put the machine back exactly as it was, for one node as for several.

The machine's state is read here, straight from the kernel's files and the iptables tools, not
through apportion's own leftover check, so the test does not share that code's blind spots.
Runs before the session's shared real node starts (one real node per machine; the order is
set in conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from apportion_dev.devcluster import DevCluster

SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
)
FIXED_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/run/containerd",
    "/var/lib/cni",
    "/opt/containerd",
)
NODE_PROCESSES = ("kubelet", "containerd", "containerd-shim-runc-v2", "kube-proxy", "pause")


def machine_state() -> dict[str, object]:
    def chains(tool: str) -> list[str]:
        saved = subprocess.run([tool], capture_output=True, text=True, check=True).stdout
        return sorted(line.split()[0] for line in saved.splitlines() if line.startswith(":"))

    def running(name: str) -> int:
        count = 0
        for entry in Path("/proc").iterdir():
            try:
                count += entry.name.isdigit() and Path(os.readlink(entry / "exe")).name == name
            except OSError:
                continue
        return count

    cgroups = Path("/sys/fs/cgroup")
    return {
        "mounts": sorted(
            line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ),
        "cgroups": sorted(
            str(p) for glob in ("*/kubepods*", "*/apportion-node*") for p in cgroups.glob(glob)
        ),
        "iptables": chains("iptables-save"),
        "ip6tables": chains("ip6tables-save"),
        "links": sorted(os.listdir("/sys/class/net")),
        "routes": subprocess.run(
            ["ip", "route", "show"], capture_output=True, text=True, check=True
        ).stdout.splitlines(),
        "netns": sorted(os.listdir("/run/netns")) if Path("/run/netns").exists() else [],
        "sysctls": {key: (Path("/proc/sys") / key).read_text().strip() for key in SYSCTLS},
        "paths": {path: os.path.lexists(path) for path in FIXED_PATHS},
        "processes": {name: running(name) for name in NODE_PROCESSES},
    }


def differences(before: dict[str, object], after: dict[str, object]) -> dict[str, object]:
    return {key: (before[key], after[key]) for key in before if before[key] != after[key]}


# A process that starts an attached real-node cluster (as `make demo` does), runs a pod on its
# last node (with several, one in a network namespace and cgroup root of its own) and waits to
# be killed: its cluster's processes then die with it, and the pod does not.
STARTER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from apportion_dev.devcluster import DevCluster
    from apportion_dev.devcluster.realnode.node import NodeSpec
    nodes = int(sys.argv[2])
    cluster = DevCluster.start(Path(sys.argv[1]), real_node=True, nodes=nodes)
    on_last = json.dumps({"spec": {"nodeName": NodeSpec(nodes - 1).name}})
    cluster.kubectl("run", "survivor", "--image=localhost/apportion:dev", "--restart=Never",
                    f"--overrides={on_last}",
                    "--command", "--", "python3", "-c", "import time; time.sleep(3601)")
    cluster.kubectl("wait", "--for=condition=Ready", "pod/survivor", "--timeout=120s")
    print("ready", flush=True)
    time.sleep(3600)
    """
)


SURVIVOR = b"time.sleep(3601)"


def start_and_kill(state_dir: Path, nodes: int) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(state_dir), str(nodes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    try:
        assert starter.stdout.readline().strip() == "ready", "the real node did not start"
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()


@pytest.fixture
def no_real_node_yet() -> dict[str, object]:
    before = machine_state()
    assert not any(before["processes"].values()), (  # type: ignore[attr-defined]
        "a real node already runs on this machine; this test must run before the session's "
        f"real node starts: {before['processes']}"
    )
    return before


def test_stop_after_sigkill_puts_the_machine_back(
    no_real_node_yet: dict[str, object], tmp_path: Path
) -> None:
    # Three nodes here and one in the next test: each way of cleaning up (stop, the next start)
    # meets one size, so that every cluster this module starts pays for itself.
    state_dir = tmp_path / "killed"
    start_and_kill(state_dir, nodes=3)
    left = machine_state()
    assert left["processes"]["containerd-shim-runc-v2"] >= 1  # type: ignore[index]
    assert differences(no_real_node_yet, left)  # the kill did leave things behind

    # `stop` without --state-dir: the killed cluster's directory is not the default one, yet the
    # abandoned node is found and cleaned up.
    env = {**os.environ, "APPORTION_DEV_CLUSTER_DIR": str(tmp_path / "default")}
    stop = subprocess.run(
        [sys.executable, "-m", "apportion", "dev-cluster", "stop"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert stop.returncode == 0, stop.stderr
    assert str(state_dir) in stop.stdout
    assert differences(no_real_node_yet, machine_state()) == {}
    assert not state_dir.exists()


def test_the_next_start_cleans_up_after_sigkill_and_stop_cleans_up_after_itself(
    no_real_node_yet: dict[str, object], tmp_path: Path
) -> None:
    start_and_kill(tmp_path / "killed", nodes=1)
    assert survivors() == 1
    cluster = DevCluster.start(tmp_path / "next", real_node=True, nodes=2)
    try:
        assert survivors() == 0  # the abandoned node's pod was killed before the new one started
        assert not (tmp_path / "killed").exists()
    finally:
        cluster.stop()
    assert differences(no_real_node_yet, machine_state()) == {}


def survivors() -> int:
    """Processes of the killed cluster's pod, which only the clean-up kills."""
    count = 0
    for entry in Path("/proc").iterdir():
        try:
            count += entry.name.isdigit() and SURVIVOR in (entry / "cmdline").read_bytes()
        except OSError:
            continue
    return count
