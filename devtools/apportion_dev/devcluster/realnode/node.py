"""Start a real node: containerd (with runc and the bridge CNI plugin), the kubelet, kube-scheduler
and kube-proxy, each with a client certificate of its own (the kubelet's names the node, so the
API server's Node authorizer and NodeRestriction apply to it as on any cluster), and then
metrics-server as an aggregated API in a pod.

The node's files live in `host.NODE_ROOT` (the state directory's `node` links there); what
the node changes elsewhere on the machine is recorded and undone by `host.clean_up`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from apportion_dev.devcluster import pki
from apportion_dev.devcluster.kubeconfig import write_client_cert_kubeconfig
from apportion_dev.devcluster.net import free_ports, http_get_json
from apportion_dev.devcluster.processes import ProcessRecord
from apportion_dev.devcluster.realnode import host, images
from apportion_dev.devcluster.tools import CONTAINERD, METRICS_SERVER, ensure_tool

NODE_NAME = "apportion-node"
NODE_LABEL = "apportion.dev/real-node"
RUNC = "/usr/sbin/runc"
METRICS_SERVER_MANIFEST = Path(__file__).with_name("metrics-server.yaml")

Spawn = Callable[..., ProcessRecord]
Wait = Callable[[Callable[[], bool], list[ProcessRecord], str], None]


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


def prepare_images(progress: Callable[[str], None]) -> list[str]:
    """Everything the node runs, built if missing: the pause image, the project's image and
    metrics-server's."""
    metrics_server = ensure_tool(METRICS_SERVER, progress) / "metrics-server"
    wanted = [
        images.ensure_pause_image(),
        images.build_image(progress),  # seconds when nothing changed: layers are cached
        images.ensure_metrics_server_image(metrics_server),
    ]
    return wanted


def start_node(
    state_root: Path,
    bin_dir: Path,
    server: str,
    admin_token: str,
    cluster_pki: pki.ClusterPki,
    spawn: Spawn,
    wait: Wait,
    node_images: list[str],
) -> None:
    shutil.rmtree(host.NODE_ROOT, ignore_errors=True)  # nothing runs from it: the machine is ours
    node = NodePaths(host.NODE_ROOT)
    (state_root / "node").symlink_to(host.NODE_ROOT)  # logs and kubeconfigs, beside the rest
    containerd_bin = ensure_tool(CONTAINERD)
    _write_cni_config(node)
    (node.of("containerd") / "config.toml").write_text(_containerd_config(node))
    containerd = spawn(
        "containerd",
        [str(containerd_bin / "containerd"), f"--config={node.of('containerd') / 'config.toml'}"],
        env={**os.environ, "PATH": f"{containerd_bin}:{os.environ.get('PATH', '')}"},
    )
    wait(lambda: node.socket.exists(), [containerd], "containerd")
    images.import_into_containerd(node_images, containerd_bin / "ctr", node.socket, node.root)

    identities = node.of("kubeconfigs")
    credentials = {
        name: write_client_cert_kubeconfig(
            identities / f"{name}.yaml",
            server,
            cluster_pki.ca.cert,
            pki.issue(cluster_pki.ca, identities, name, common_name=user, organizations=groups),
        )
        for name, user, groups in (
            ("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
            ("kube-scheduler", "system:kube-scheduler", ()),
            ("kube-proxy", "system:kube-proxy", ()),
        )
    }
    serving = pki.issue(
        cluster_pki.ca,
        node.of("kubelet"),
        "kubelet-serving",
        common_name=f"system:node:{NODE_NAME}",
        organizations=("system:nodes",),
        ips=(host.GATEWAY,),
        dns_names=(NODE_NAME,),
    )
    kubelet_port, healthz_port, proxy_metrics, proxy_healthz = free_ports(4)
    kubelet_config = _kubelet_config(node, cluster_pki, serving, kubelet_port, healthz_port)
    (node.of("kubelet") / "config.yaml").write_text(yaml.safe_dump(kubelet_config))
    kubelet = spawn(
        "kubelet",
        [
            str(bin_dir / "kubelet"),
            f"--config={node.of('kubelet') / 'config.yaml'}",
            f"--kubeconfig={credentials['kubelet']}",
            f"--root-dir={node.of('kubelet') / 'root'}",
            f"--cert-dir={node.of('kubelet') / 'pki'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={host.GATEWAY}",
            f"--node-labels={NODE_LABEL}=true",
        ],
    )
    scheduler = spawn(
        "kube-scheduler",
        [
            str(bin_dir / "kube-scheduler"),
            f"--kubeconfig={credentials['kube-scheduler']}",
            f"--authentication-kubeconfig={credentials['kube-scheduler']}",
            f"--authorization-kubeconfig={credentials['kube-scheduler']}",
            "--leader-elect=false",
            "--secure-port=0",
        ],
    )
    proxy = spawn(
        "kube-proxy",
        [
            str(bin_dir / "kube-proxy"),
            f"--kubeconfig={credentials['kube-proxy']}",
            "--proxy-mode=iptables",
            "--conntrack-max-per-core=0",
            f"--cluster-cidr={host.CLUSTER_CIDR}",
            f"--hostname-override={NODE_NAME}",
            f"--metrics-bind-address=127.0.0.1:{proxy_metrics}",
            f"--healthz-bind-address=127.0.0.1:{proxy_healthz}",
        ],
    )

    def ready() -> bool:
        found = http_get_json(
            f"{server}/api/v1/nodes/{NODE_NAME}", token=admin_token, ca_file=cluster_pki.ca.cert
        )
        return bool(found) and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in found.get("status", {}).get("conditions", [])
        )

    wait(ready, [containerd, kubelet, scheduler, proxy], "the real node")


def _write_cni_config(node: NodePaths) -> None:
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
                    "ranges": [[{"subnet": host.POD_CIDR, "gateway": host.GATEWAY}]],
                    # Service IPs (10.0.0.0/24) are routed through the node, where kube-proxy
                    # translates them.
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(node.of("cni") / "ipam"),
                },
            }
        ],
    }
    (node.of("cni") / "net.d").mkdir(exist_ok=True)
    (node.of("cni") / "net.d" / "10-apportion.conflist").write_text(json.dumps(conflist, indent=2))


def _containerd_config(node: NodePaths) -> str:
    # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc fails every sandbox when
    # it may not lower its own oom_score_adj (real-node.md).
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
    node: NodePaths,
    cluster_pki: pki.ClusterPki,
    serving: pki.KeyPair,
    port: int,
    healthz_port: int,
) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine kind runs cgroup v1, which the kubelet refuses unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": host.GATEWAY,
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
    }


def metrics_server_manifest() -> str:
    return METRICS_SERVER_MANIFEST.read_text().replace("IMAGE", images.METRICS_SERVER_IMAGE)
