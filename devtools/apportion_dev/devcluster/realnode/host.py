"""What a real node needs from the machine, what it changes there, and how to undo it.

A kubelet and containerd change host-wide things whatever directories they are given: sysctls,
iptables chains, cgroups under /kubepods, mounts, network namespaces, a bridge and a few fixed
paths. So there is one real-node cluster per machine at a time, and a record of the machine as it
was (in /run, which a reboot clears together with everything it describes) lets `stop` — or the
next `start`, after a SIGKILL — put it back.

The first node runs in the machine's own network namespace, beside the API server; every further
node in a network namespace of its own (`create_node_network`), joined to the machine by a veth
pair, with its pod CIDR routed through it, and under a cgroup root of its own
(`create_cgroup_root`), so that no kubelet takes another's pods for orphans and kills them.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.state import mountpoints, mounts_under

BRIDGE = "apportion0"
GATEWAY = "10.244.0.1"  # the bridge's address: the first node's IP and the API server's
CLUSTER_CIDR = "10.244.0.0/16"
# Names of what further nodes make: network namespaces (in /run/netns) and cgroup roots are named
# after the node (`apportion-node-N`), the machine's ends of their veth pairs `apportion-vN`.
NODE_PREFIX = "apportion-node-"
VETH_PREFIX = "apportion-v"
NETNS_DIR = Path("/run/netns")
CNI_NETWORK = "apportion-realnode"
RECORD_DIR = Path(os.environ.get("APPORTION_REALNODE_RECORD", "/run/apportion-realnode"))
# The node's files (containerd's images and snapshots, the kubelet's root, pod logs). A short
# path of its own, not the state directory: the kubelet and containerd make unix sockets below
# it, and a socket path may not exceed ~104 bytes (a pytest tmp_path does). One node per machine.
NODE_ROOT = Path(os.environ.get("APPORTION_REALNODE_ROOT", "/var/lib/apportion-realnode"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
CNI_BIN_DIR = Path("/usr/lib/cni")
# sysctls the kubelet, kube-proxy and the bridge plugin set on their own.
SYSCTLS = (
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
)
# Paths the kubelet and containerd create whatever they are configured with.
FIXED_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/run/containerd",
    "/run/netns",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
)
CHAIN_PREFIXES = ("KUBE-", "CNI-")
DEBIAN_PACKAGES = ("runc", "containernetworking-plugins", "buildah", "iptables", "debootstrap")


def why_not() -> str | None:
    """None when this machine can run a real node, else the reason in one line."""
    if platform.system() != "Linux":
        return f"a real node needs Linux (this is {platform.system()})"
    if os.geteuid() != 0:
        return "a real node needs root (kubelet, containerd, iptables and mounts)"
    missing = [tool for tool in ("runc", "buildah", "iptables", "ip") if shutil.which(tool) is None]
    if not (CNI_BIN_DIR / "bridge").exists():
        missing.append(f"CNI plugins in {CNI_BIN_DIR}")
    if missing:
        return f"{', '.join(missing)} missing (Debian: apt-get install {' '.join(DEBIAN_PACKAGES)})"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlay filesystem"
    if not Path("/proc/sys/net/bridge").exists():
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True, check=False)
        if not Path("/proc/sys/net/bridge").exists():
            return "the kernel has no br_netfilter (bridged pod traffic would skip kube-proxy)"
    if (
        not any((CGROUP_ROOT / c).is_dir() for c in ("memory", "cpu"))
        and not (CGROUP_ROOT / "cgroup.controllers").exists()
    ):
        return "no cgroup hierarchy with the memory and cpu controllers"
    return None


def cgroup_version() -> int:
    return 2 if (CGROUP_ROOT / "cgroup.controllers").exists() else 1


@dataclass
class MachineRecord:
    """The machine before the node: which state directory owns the node, the sysctls' values and
    which fixed paths already existed."""

    owner: str
    sysctls: dict[str, str] = field(default_factory=dict)
    existing_paths: list[str] = field(default_factory=list)

    @classmethod
    def capture(cls, owner: Path) -> MachineRecord:
        return cls(
            owner=str(owner),
            sysctls={key: value for key in SYSCTLS if (value := _read_sysctl(key)) is not None},
            existing_paths=[p for p in FIXED_PATHS if os.path.lexists(p)],
        )


def _read_sysctl(key: str) -> str | None:
    try:
        return (Path("/proc/sys") / key).read_text().strip()
    except OSError:
        return None


def load_record() -> MachineRecord | None:
    try:
        return MachineRecord(**json.loads((RECORD_DIR / "machine.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def claim_machine(owner: Path) -> MachineRecord:
    """Record the machine before a node starts. The caller has cleaned up a node abandoned by
    a dead cluster (`cluster.clean_up_abandoned_node`); a record still here belongs to a node
    that runs, and is refused."""
    previous = load_record()
    if previous is not None:
        raise DevClusterError(
            f"a real node already runs on this machine (dev-cluster in {previous.owner}); "
            "there can be one at a time: stop it first"
        )
    record = MachineRecord.capture(owner)
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    (RECORD_DIR / "machine.json").write_text(json.dumps(asdict(record), indent=2))
    return record


def create_bridge() -> None:
    """The pod bridge, made before the node so that the API server and the kubelet can listen on
    its address (pods reach both there; nothing listens on the machine's other interfaces)."""
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        _run("ip", "link", "delete", BRIDGE)
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")


def create_node_network(name: str, veth: str, host_ip: str, node_ip: str, pod_cidr: str) -> None:
    """A network namespace `name` for a further node: its `eth0` has `node_ip`/24 and routes
    everything through the machine's end `veth` (`host_ip`/24), and the machine routes the node's
    `pod_cidr` back through it. Both forward, so pods on any node reach each other, the API server
    and the machine."""
    path = NETNS_DIR / name
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    path.touch()
    # unshare bind-mounts the new namespace onto the file; `ip netns add` would also make
    # /run/netns a mount point of its own, one more thing to undo.
    _run("unshare", f"--net={path}", "true")
    _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
    _run("ip", "addr", "add", f"{host_ip}/24", "dev", veth)
    _run("ip", "link", "set", veth, "up")
    _run("ip", "-n", name, "addr", "add", f"{node_ip}/24", "dev", "eth0")
    _run("ip", "-n", name, "link", "set", "eth0", "up")
    _run("ip", "-n", name, "link", "set", "lo", "up")
    _run("ip", "-n", name, "route", "add", "default", "via", host_ip)
    _run("ip", "route", "add", pod_cidr, "via", node_ip, "dev", veth)
    (Path("/proc/sys") / "net/ipv4/ip_forward").write_text("1")  # recorded, restored at stop
    _run("nsenter", f"--net={path}", "sysctl", "-qw", "net.ipv4.ip_forward=1")


def in_netns(name: str, argv: list[str]) -> list[str]:
    """`argv` run in the network namespace `name` (only that: the mounts stay the machine's,
    where the node's clean-up finds them). nsenter execs, so the pid is the command's."""
    return ["nsenter", f"--net={NETNS_DIR / name}", "--", *argv]


def create_cgroup_root(name: str) -> str:
    """A cgroup `/name` in every hierarchy, for a further node's kubelet (`cgroupRoot`, which
    must exist): each kubelet kills pods in its pod cgroups that it does not know, so two
    kubelets must not share /kubepods."""
    hierarchies = [CGROUP_ROOT] if cgroup_version() == 2 else _hierarchies()
    for hierarchy in hierarchies:
        (hierarchy / name).mkdir(exist_ok=True)
        if hierarchy.name == "cpuset":
            # A v1 cpuset cgroup starts with no CPUs and no memory nodes: nothing could run in it.
            for leaf in ("cpuset.cpus", "cpuset.mems"):
                (hierarchy / name / leaf).write_text((hierarchy / leaf).read_text())
    return f"/{name}"


def _hierarchies() -> list[Path]:
    return [h for h in CGROUP_ROOT.iterdir() if (h / "cgroup.procs").exists()]


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise DevClusterError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


# --- tearing down -----------------------------------------------------------------------------


def kill_pods(node: str | None = None) -> None:
    """SIGKILL every process in a pod (they all live in pod cgroups), then the runc shims, which
    outlive containerd. With `node`, only a further node's, whose cgroups and containerd's
    files (named in its shims' command lines) are under its name: what its machine dying does."""
    for _ in range(20):
        pids = _pod_pids(node)
        if not pids:
            break
        for pid in pids:
            _kill(pid)
        time.sleep(0.1)
    for pid in _processes_named("containerd-shim-runc-v2"):
        if node is None or f"/{node}/".encode() in _cmdline(pid):
            _kill(pid)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def _pod_pids(node: str | None = None) -> set[int]:
    pids: set[int] = set()
    cgroups = _kubepods_cgroups("cgroup.procs")
    for procs in [c for c in cgroups if node in c.parts] if node else cgroups:
        try:
            pids.update(int(line) for line in procs.read_text().split())
        except OSError:
            continue
    return pids


def _kubepods_cgroups(leaf: str = "") -> list[Path]:
    """Every cgroup directory under a kubepods root or a further node's cgroup root, deepest
    first (the order rmdir needs)."""
    found: list[Path] = []
    hierarchies = [CGROUP_ROOT] if cgroup_version() == 2 else []
    hierarchies += [h for h in CGROUP_ROOT.iterdir() if h.is_dir()] if CGROUP_ROOT.is_dir() else []
    roots: list[Path] = []
    for hierarchy in hierarchies:
        roots += [hierarchy / "kubepods", hierarchy / "kubepods.slice"]
        roots += sorted(hierarchy.glob(f"{NODE_PREFIX}*"))
    for root in roots:
        # os.walk skips what vanishes while it looks (the kubelet removes cgroups meanwhile)
        found.extend(Path(directory) for directory, _, _ in os.walk(root))
    found.sort(key=lambda p: len(p.parts), reverse=True)
    return [p / leaf if leaf else p for p in dict.fromkeys(found)]


def _processes_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "exe")).name == name:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def clean_up(record: MachineRecord, kube_proxy: Path | None = None) -> None:
    """Undo what a node did to the machine, in the order that works: pods, chains, mounts,
    cgroups, the bridge, fixed paths, sysctls. Safe to run twice."""
    kill_pods()
    if kube_proxy is not None and kube_proxy.exists():
        _run(str(kube_proxy), "--cleanup", check=False)
    _remove_chains()
    for mount in sorted(_our_mounts(Path(record.owner)), key=len, reverse=True):
        _run("umount", "-l", mount, check=False)
    if not mounts_under(NODE_ROOT):
        shutil.rmtree(NODE_ROOT, ignore_errors=True)
    for cgroup in _kubepods_cgroups():
        with contextlib.suppress(OSError):
            cgroup.rmdir()
    for netns in _netns():
        netns.unlink(missing_ok=True)
    for link in _links():
        # Deleting one end of a veth pair deletes the other, in the node's namespace.
        _run("ip", "link", "delete", link, check=False)
    for path in FIXED_PATHS:
        ours = path not in record.existing_paths and os.path.lexists(path)
        if ours and not mounts_under(Path(path)):
            shutil.rmtree(path, ignore_errors=True)
    for key, value in record.sysctls.items():
        if _read_sysctl(key) != value:
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value)
    shutil.rmtree(RECORD_DIR, ignore_errors=True)


def _netns() -> list[Path]:
    """Network namespaces of pods (made by the CNI plugin) and of further nodes."""
    if not NETNS_DIR.is_dir():
        return []
    return [*NETNS_DIR.glob("cni-*"), *NETNS_DIR.glob(f"{NODE_PREFIX}*")]


def _links() -> list[str]:
    """The pod bridge and the machine's ends of further nodes' veth pairs."""
    return [
        link.name
        for link in Path("/sys/class/net").iterdir()
        if link.name == BRIDGE or link.name.startswith(VETH_PREFIX)
    ]


def _our_mounts(state_root: Path) -> list[str]:
    prefixes = (f"{NETNS_DIR}/cni-", f"{NETNS_DIR}/{NODE_PREFIX}")
    netns = [p for p in mountpoints() if p.startswith(prefixes)]
    return [
        *mounts_under(state_root),
        *mounts_under(NODE_ROOT),
        *mounts_under(Path("/var/lib/kubelet")),
        *netns,
    ]


def _chains() -> dict[tuple[str, str], list[str]]:
    """(tool, table) → our chains present, from iptables-save and ip6tables-save."""
    found: dict[tuple[str, str], list[str]] = {}
    for tool in ("iptables", "ip6tables"):
        if shutil.which(f"{tool}-save") is None:
            continue
        table = ""
        for line in _run(f"{tool}-save", check=False).stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line[1:].startswith(CHAIN_PREFIXES):
                found.setdefault((tool, table), []).append(line[1:].split()[0])
    return found


def _remove_chains() -> None:
    for (tool, table), chains in _chains().items():
        # First every rule that jumps to one of ours (from built-in chains too), then the chains.
        listing = _run(tool, "-t", table, "-S", check=False).stdout.splitlines()
        for rule in listing:
            parts = rule.split()
            if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in chains:
                _run(tool, "-t", table, "-D", *parts[1:], check=False)
        for chain in chains:
            _run(tool, "-t", table, "-F", chain, check=False)
        for chain in chains:
            _run(tool, "-t", table, "-X", chain, check=False)


def leftovers(record: MachineRecord | None, state_root: Path | None = None) -> list[str]:
    """What a node left on the machine; empty when it is as it was. `record` gives the sysctls
    and paths as they were before (None: only what no machine has without a node)."""
    found = [f"mount {m}" for m in _our_mounts(state_root or Path("/nonexistent"))]
    found += [f"cgroup {c}" for c in _kubepods_cgroups()]
    found += [
        f"{tool} {table} chain {chain}"
        for (tool, table), chains in _chains().items()
        for chain in chains
    ]
    found += [f"link {link}" for link in _links()]
    found += [f"netns {netns.name}" for netns in _netns()]
    if NODE_ROOT.exists():
        found.append(f"path {NODE_ROOT}")
    found += [
        f"process {name} {pid}"
        for name in ("kubelet", "containerd", "containerd-shim-runc-v2", "kube-proxy")
        for pid in _processes_named(name)
    ]
    if record is not None:
        found += [
            f"sysctl {key}={now} (was {value})"
            for key, value in record.sysctls.items()
            if (now := _read_sysctl(key)) != value
        ]
        found += [
            f"path {p}"
            for p in FIXED_PATHS
            if p not in record.existing_paths and os.path.lexists(p)
        ]
    return found
