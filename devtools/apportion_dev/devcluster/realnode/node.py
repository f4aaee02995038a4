"""Start real nodes: each with containerd (with runc and the bridge CNI plugin), a kubelet and
kube-proxy, then one kube-scheduler, each with a client certificate of its own (a kubelet's names
its node, so the API server's Node authorizer and NodeRestriction apply to it as on any cluster);
then metrics-server as an aggregated API in a pod.

The first node's files live in `host.NODE_ROOT` (the state directory's `node` links there), a
further node's in a directory of that name below it; what the nodes change elsewhere on the
machine is recorded and undone by `host.clean_up`. Where each node runs: `NodeSpec`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from apportion_dev.devcluster import pki, registry
from apportion_dev.devcluster.build import ensure_built
from apportion_dev.devcluster.kubeconfig import write_client_cert_kubeconfig
from apportion_dev.devcluster.net import free_ports, http_get_json
from apportion_dev.devcluster.processes import ProcessRecord
from apportion_dev.devcluster.realnode import host, images
from apportion_dev.devcluster.tools import CONTAINERD, ensure_tool

NODE_NAME = "apportion-node"
NODE_LABEL = "apportion.dev/real-node"
ZONE_LABEL = "topology.kubernetes.io/zone"
MAX_NODES = 4  # what two cores and the kubelets' ~90 MiB each carry beside the control plane
# A node's lease is renewed every quarter of its duration (5 s); the node lifecycle controller
# (kube-controller-manager --node-monitor-grace-period, cluster.py) marks a node whose lease is
# that old NotReady. Upstream's 40 s make every node-loss test wait a minute for nothing.
NODE_LEASE_SECONDS = 20
RUNC = "/usr/sbin/runc"
METRICS_SERVER_MANIFEST = Path(__file__).with_name("metrics-server.yaml")

Spawn = Callable[..., ProcessRecord]
Wait = Callable[[Callable[[], bool], list[ProcessRecord], str], None]


@dataclass(frozen=True)
class NodeSpec:
    """Where node `index` runs. Node 0 is the single node as it always was: the machine's network
    namespace, the pod bridge the API server listens on, /kubepods. Node N > 0 has a network
    namespace, a veth pair on 10.243.N.0/24 and a cgroup root of its own (`host`); every node has
    its own pod CIDR 10.244.N.0/24 and zone zone-a, zone-b, ..."""

    index: int

    @property
    def name(self) -> str:
        return NODE_NAME if self.index == 0 else f"{host.NODE_PREFIX}{self.index}"

    @property
    def zone(self) -> str:
        return f"zone-{chr(ord('a') + self.index)}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.244.{self.index}.1"

    @property
    def ip(self) -> str:
        """The node's InternalIP, where its kubelet listens."""
        return host.GATEWAY if self.index == 0 else f"10.243.{self.index}.2"

    @property
    def host_ip(self) -> str:
        """The machine's end of the node's veth pair (node N > 0)."""
        return f"10.243.{self.index}.1"

    @property
    def netns(self) -> str | None:
        return None if self.index == 0 else self.name

    @property
    def paths(self) -> NodePaths:
        return NodePaths(host.NODE_ROOT if self.index == 0 else host.NODE_ROOT / self.name)

    def process(self, component: str) -> str:
        """The name a component's process and log file get (`kubelet@apportion-node-1`)."""
        return component if self.index == 0 else f"{component}@{self.name}"

    def command(self, argv: list[str]) -> list[str]:
        return argv if self.netns is None else host.in_netns(self.netns, argv)


def component_of(process: str) -> str:
    """`kubelet` of `kubelet@apportion-node-1` (and of `kubelet`)."""
    return process.partition("@")[0]


def node_of(process: str) -> str | None:
    """The node a process belongs to (`apportion-node-1` of `kubelet@apportion-node-1`), None
    for the first node's and the control plane's."""
    return process.partition("@")[2] or None


@dataclass(frozen=True)
class NodePaths:
    root: Path

    def of(self, component: str) -> Path:
        """The directory of one component (containerd, kubelet, cni, …), made on first use."""
        path = self.root / component
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def socket(self) -> Path:
        return self.of("containerd") / "containerd.sock"


@dataclass(frozen=True)
class ImageSources:
    """Where the nodes' containerd gets images: `imported` into each at start (built here; each
    with the other names the node gives it), and with `mirror` (a registry's host:port) the
    published names (`registry.MIRRORED_HOSTS`) pulled from it."""

    imported: Mapping[str, list[str]]
    mirror: str | None = None


def prepare_images(progress: Callable[[str], None]) -> dict[str, list[str]]:
    """Everything the node runs, built if missing: the pause image, the project's image (under
    the names manifests/ publish it as, too) and metrics-server's."""
    metrics_server = ensure_built(progress) / "metrics-server"
    return {
        images.ensure_pause_image(): [],
        images.build_image(progress): images.published_names(),  # cached layers: seconds
        images.ensure_metrics_server_image(metrics_server): [],
    }


def start_nodes(
    count: int,
    state_root: Path,
    bin_dir: Path,
    server: str,
    admin_token: str,
    cluster_pki: pki.ClusterPki,
    spawn: Spawn,
    wait: Wait,
    node_images: ImageSources,
) -> None:
    """Start `count` nodes and one scheduler, and wait until every node is Ready. Every node's
    containerd first, so the images (exported once) go into all of them while nothing else
    starts."""
    shutil.rmtree(host.NODE_ROOT, ignore_errors=True)  # nothing runs from it: the machine is ours
    specs = [NodeSpec(i) for i in range(count)]
    (state_root / "node").symlink_to(host.NODE_ROOT)  # logs and kubeconfigs, beside the rest
    containerd_bin = ensure_tool(CONTAINERD)
    started = []
    for spec in specs:
        if spec.netns is not None:
            host.create_node_network(
                spec.netns, f"{host.VETH_PREFIX}{spec.index}", spec.host_ip, spec.ip, spec.pod_cidr
            )
        node = spec.paths
        _write_cni_config(spec)
        hosts = None
        if node_images.mirror is not None:
            hosts = node.of("containerd") / "certs.d"
            registry.write_mirrors(hosts, node_images.mirror)
        (node.of("containerd") / "config.toml").write_text(_containerd_config(node, hosts))
        started.append(
            spawn(
                spec.process("containerd"),
                spec.command(
                    [
                        str(containerd_bin / "containerd"),
                        f"--config={node.of('containerd') / 'config.toml'}",
                    ]
                ),
                env={**os.environ, "PATH": f"{containerd_bin}:{os.environ.get('PATH', '')}"},
            )
        )
    wait(lambda: all(s.paths.socket.exists() for s in specs), started, "containerd")
    images.import_into_containerd(
        list(node_images.imported),
        containerd_bin / "ctr",
        [s.paths.socket for s in specs],
        host.NODE_ROOT,
        node_images.imported,
    )
    for spec in specs:
        started += _start_kubelet_and_proxy(spec, bin_dir, server, cluster_pki, spawn)
    scheduler_identity = _client_identity(
        host.NODE_ROOT, server, cluster_pki, "kube-scheduler", "system:kube-scheduler", ()
    )
    started.append(
        spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={scheduler_identity}",
                f"--authentication-kubeconfig={scheduler_identity}",
                f"--authorization-kubeconfig={scheduler_identity}",
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )
    )

    def ready() -> bool:
        found = http_get_json(
            f"{server}/api/v1/nodes?labelSelector={NODE_LABEL}%3Dtrue",
            token=admin_token,
            ca_file=cluster_pki.ca.cert,
        )
        ready = {n["metadata"]["name"] for n in (found or {}).get("items", []) if _ready(n)}
        return ready >= {s.name for s in specs}

    wait(ready, started, "the real nodes" if count > 1 else "the real node")


def _ready(node: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions", [])
    )


def _client_identity(
    root: Path,
    server: str,
    cluster_pki: pki.ClusterPki,
    name: str,
    user: str,
    groups: tuple[str, ...],
) -> Path:
    """A kubeconfig with a client certificate for `user` in `groups`."""
    identities = NodePaths(root).of("kubeconfigs")
    return write_client_cert_kubeconfig(
        identities / f"{name}.yaml",
        server,
        cluster_pki.ca.cert,
        pki.issue(cluster_pki.ca, identities, name, common_name=user, organizations=groups),
    )


def _start_kubelet_and_proxy(
    spec: NodeSpec, bin_dir: Path, server: str, cluster_pki: pki.ClusterPki, spawn: Spawn
) -> list[ProcessRecord]:
    node = spec.paths
    kubelet_identity = _client_identity(
        node.root, server, cluster_pki, "kubelet", f"system:node:{spec.name}", ("system:nodes",)
    )
    proxy_identity = _client_identity(
        node.root, server, cluster_pki, "kube-proxy", "system:kube-proxy", ()
    )
    serving = pki.issue(
        cluster_pki.ca,
        node.of("kubelet"),
        "kubelet-serving",
        common_name=f"system:node:{spec.name}",
        organizations=("system:nodes",),
        ips=(spec.ip,),
        dns_names=(spec.name,),
    )
    # A further node has a network namespace of its own, where every port is free.
    kubelet_port, healthz_port, proxy_metrics, proxy_healthz = free_ports(4)
    cgroup_root = "/" if spec.netns is None else host.create_cgroup_root(spec.name)
    kubelet_config = _kubelet_config(
        spec, cluster_pki, serving, kubelet_port, healthz_port, cgroup_root
    )
    (node.of("kubelet") / "config.yaml").write_text(yaml.safe_dump(kubelet_config))
    kubelet = spawn(
        spec.process("kubelet"),
        spec.command(
            [
                str(bin_dir / "kubelet"),
                f"--config={node.of('kubelet') / 'config.yaml'}",
                f"--kubeconfig={kubelet_identity}",
                f"--root-dir={node.of('kubelet') / 'root'}",
                f"--cert-dir={node.of('kubelet') / 'pki'}",
                f"--hostname-override={spec.name}",
                f"--node-ip={spec.ip}",
                f"--node-labels={NODE_LABEL}=true,{ZONE_LABEL}={spec.zone}",
            ]
        ),
    )
    proxy = spawn(
        spec.process("kube-proxy"),
        spec.command(
            [
                str(bin_dir / "kube-proxy"),
                f"--kubeconfig={proxy_identity}",
                "--proxy-mode=iptables",
                "--conntrack-max-per-core=0",
                f"--cluster-cidr={host.CLUSTER_CIDR}",
                f"--hostname-override={spec.name}",
                f"--metrics-bind-address=127.0.0.1:{proxy_metrics}",
                f"--healthz-bind-address=127.0.0.1:{proxy_healthz}",
            ]
        ),
    )
    return [kubelet, proxy]


def _write_cni_config(spec: NodeSpec) -> None:
    # No ipMasq and no portmap: pods talk to the node and to each other only, and neither plugin
    # then leaves iptables chains behind when a node is killed.
    conflist = {
        "cniVersion": "1.0.0",
        "name": host.CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": host.BRIDGE,
                "isGateway": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": spec.pod_cidr, "gateway": spec.pod_gateway}]],
                    # Service IPs (10.0.0.0/24) are routed through the node, where kube-proxy
                    # translates them.
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(spec.paths.of("cni") / "ipam"),
                },
            }
        ],
    }
    (spec.paths.of("cni") / "net.d").mkdir(exist_ok=True)
    conf = spec.paths.of("cni") / "net.d" / "10-apportion.conflist"
    conf.write_text(json.dumps(conflist, indent=2))


def _containerd_config(node: NodePaths, hosts: Path | None = None) -> str:
    # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc fails every sandbox when
    # it may not lower its own oom_score_adj (real-node.md). `hosts`: the registry hosts
    # directory (`<host>/hosts.toml`), which containerd reads on every pull.
    registries = (
        ""
        if hosts is None
        else f"""
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "{hosts}"
"""
    )
    return f"""\
version = 3
root = "{node.of("containerd") / "root"}"
state = "{node.of("containerd") / "state"}"

[grpc]
  address = "{node.socket}"

[ttrpc]
  address = "{node.of("containerd") / "containerd.sock.ttrpc"}"

[plugins.'io.containerd.internal.v1.opt']
  path = "{node.of("containerd") / "opt"}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{images.PAUSE_IMAGE}"
{registries}
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = false
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "{RUNC}"
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["{host.CNI_BIN_DIR}"]
  conf_dir = "{node.of("cni") / "net.d"}"
"""


def _kubelet_config(
    spec: NodeSpec,
    cluster_pki: pki.ClusterPki,
    serving: pki.KeyPair,
    port: int,
    healthz_port: int,
    cgroup_root: str,
) -> dict[str, object]:
    node = spec.paths
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine kind runs cgroup v1, which the kubelet refuses unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": spec.ip,
        "port": port,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "readOnlyPort": 0,
        # Signed by the cluster CA, so the API server and metrics-server verify the kubelet.
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "podLogsDir": str(node.of("pod-logs")),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(cluster_pki.ca.cert)},
        },
        "authorization": {"mode": "Webhook"},
        # Images cannot be pulled again here: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
    }


def metrics_server_manifest() -> str:
    return METRICS_SERVER_MANIFEST.read_text().replace("IMAGE", images.METRICS_SERVER_IMAGE)
