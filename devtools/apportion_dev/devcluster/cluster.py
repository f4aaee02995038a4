"""DevCluster: etcd, kube-apiserver, kube-controller-manager and the pod simulator on loopback.

What envtest does, plus what envtest leaves out: the controller-manager (so Deployments and
StatefulSets create Pods, garbage collection and namespace deletion work) and a pod simulator (so
those Pods get bound, run and deleted). Every port is picked free at start, every file lives in
the state directory, and `stop` removes both the processes and the directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from apportion_dev.devcluster import distserver, pki, processes, registry, restore
from apportion_dev.devcluster.build import Progress, ensure_built
from apportion_dev.devcluster.credentials import (
    new_token,
    write_service_account_key,
    write_token_file,
)
from apportion_dev.devcluster.kubeconfig import write_kubeconfig
from apportion_dev.devcluster.net import free_ports, http_get, http_get_json
from apportion_dev.devcluster.paths import DevClusterError, module_versions
from apportion_dev.devcluster.podsim.ipam import random_prefix
from apportion_dev.devcluster.podsim.objects import SIM_NODE_LABEL
from apportion_dev.devcluster.processes import ProcessRecord
from apportion_dev.devcluster.realnode import host, node
from apportion_dev.devcluster.state import (
    ClusterState,
    Layout,
    claim,
    default_state_dir,
    load_state,
    release,
    save_state,
)

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service: the first address of SERVICE_CIDR
# How fast a lost real node shows, short for tests yet in upstream's proportions (docs/
# dev-cluster.md): the node lifecycle controller looks every 2 s and marks a node whose lease
# (renewed every 5 s, node.NODE_LEASE_SECONDS) is 20 s old NotReady/Unknown, tainting it; pods
# tolerate that taint for 10 s (the API server's DefaultTolerationSeconds, upstream 300 s), then
# they are evicted. Upstream: 5 s, 50 s.
NODE_MONITOR_FLAGS = ("--node-monitor-period=2s", "--node-monitor-grace-period=20s")
TOLERATION_FLAGS = (
    "--default-not-ready-toleration-seconds=10",
    "--default-unreachable-toleration-seconds=10",
)
START_ATTEMPTS = 3  # a free port can be taken by someone else before we bind it
READY_TIMEOUT = 90.0
KEEP_STATE_ENV = "APPORTION_KEEP_STATE"
# Stop order: whatever runs pods first (the simulator stops its pod processes; after the kubelet,
# the real node's pods are killed), then the node's services, etcd last.
STOP_ORDER = (
    ("podsim", "kubelet"),
    ("kube-scheduler", "kube-proxy", "containerd"),
    ("kube-controller-manager", "kube-apiserver"),
    ("etcd",),
)


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


class _AddressInUse(Exception):
    pass


@dataclass(frozen=True)
class _Serving:
    """What runs beside the cluster for a release: the OCI registry, and `dist` served."""

    registry: bool
    dist: Path | None


def _shutdown(records: Sequence[ProcessRecord], layout: Layout, bin_dir: Path) -> None:
    """Stop processes in dependency order (every node's kubelet at once, ...), put the machine
    back as it was if a real node ran, then delete the state directory (unless
    APPORTION_KEEP_STATE is set, to read logs after a failure)."""
    real_node = any(node.component_of(r.name) == "kubelet" for r in records)
    for names in STOP_ORDER:
        processes.terminate([r for r in records if node.component_of(r.name) in names])
        if real_node and "kubelet" in names:
            host.kill_pods()
    processes.terminate(
        [r for r in records if not any(node.component_of(r.name) in n for n in STOP_ORDER)]
    )
    record = host.load_record()
    if record is not None and record.owner == str(layout.root):
        host.clean_up(record, kube_proxy=bin_dir / "kube-proxy")
    if os.environ.get(KEEP_STATE_ENV):
        print(f"dev-cluster state kept in {layout.root} ({KEEP_STATE_ENV} is set)", file=sys.stderr)
    else:
        release(layout)


class DevCluster:
    """A running dev-cluster. Create with `DevCluster.start()` (or `attach()` to one started
    elsewhere); `stop()` or leave the `with` block to tear it down."""

    def __init__(self, layout: Layout, state: ClusterState, *, owned: bool) -> None:
        self._layout = layout
        self._state = state
        # A cluster this interpreter started attached is stopped at the latest when the
        # interpreter exits; one found through attach() is stopped only on request.
        self._finalizer = (
            # The list itself, not a copy: components restarted by `restore_etcd` replace
            # their records in it.
            weakref.finalize(self, _shutdown, state.processes, layout, Path(state.bin_dir))
            if owned
            else None
        )

    # --- lifecycle --------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        state_dir: Path | None = None,
        pod_simulator: bool = True,
        *,
        real_node: bool = False,
        nodes: int = 1,
        registry: bool = False,
        dist: Path | None = None,
        detach: bool = False,
        progress: Progress | None = None,
        binaries: Path | None = None,
    ) -> DevCluster:
        """Build the binaries if needed, start everything, wait until it works.

        state_dir: where data, logs, pod logs and the kubeconfig go; a fresh temporary directory
            when None. An existing directory must be empty or an earlier dev-cluster's.
        real_node: run a real node (kubelet, containerd, kube-scheduler, kube-proxy,
            metrics-server; see apportion_dev.devcluster.realnode) instead of the pod simulator. It
            needs root on Linux (`host.why_not` says what is missing) and there is one per machine.
        nodes: how many real nodes (up to `node.MAX_NODES`), each with its own containerd,
            kubelet and kube-proxy, network namespace, pod CIDR and zone (`node.NodeSpec`).
        registry: run an OCI registry (apportion_dev.devcluster.registry) that real nodes pull
            the published image names (`ghcr.io/...`) from.
        dist: a release directory (`make release`'s dist/): push its images and charts into the
            registry (implies `registry`) and serve its Python distributions as a package index
            and its Maven repository (apportion_dev.devcluster.distserver).
        detach: leave the processes running after this interpreter exits (the CLI's `start`);
            otherwise they stop with it at the latest.
        binaries: a directory with etcd, kube-apiserver, kube-controller-manager and kubectl of
            another Kubernetes version (`tools.OLDEST_KUBERNETES`), run with the pod simulator
            instead of this checkout's control plane.
        """
        if not 1 <= nodes <= node.MAX_NODES or (nodes > 1 and not real_node):
            raise DevClusterError(
                f"{nodes} nodes: 1 to {node.MAX_NODES} real nodes, or the pod simulator's own"
            )
        if binaries is not None and real_node:
            raise DevClusterError("a real node runs this checkout's Kubernetes only")
        bin_dir = ensure_built(progress) if binaries is None else binaries
        if dist is not None:
            dist = Path(dist).resolve()
            if not dist.is_dir():
                raise DevClusterError(f"--dist {dist}: no such directory")
        with_registry = registry or dist is not None
        node_images: dict[str, list[str]] = {}
        if real_node:
            reason = host.why_not()
            if reason:
                raise DevClusterError(f"no real node on this machine: {reason}")
            node_images = node.prepare_images(progress or _say)
        version = module_versions().kubernetes if binaries is None else _version_of(bin_dir)
        if state_dir is None:
            layout = Layout(Path(tempfile.mkdtemp(prefix="apportion-dev-cluster-")))
        else:
            layout = Layout(Path(state_dir).resolve())
            previous = cls._existing(layout)
            if previous is not None:
                status = previous.process_status()
                if all(status.values()):
                    raise DevClusterError(f"a dev-cluster is already running in {layout.root}")
                if any(status.values()):
                    # Starting anew would either run a second control plane beside the live
                    # half or throw its data away: the user decides.
                    up = ", ".join(n for n, alive in status.items() if alive)
                    down = ", ".join(n for n, alive in status.items() if not alive)
                    raise DevClusterError(
                        f"the dev-cluster in {layout.root} is half running ({down} down, {up} "
                        "up): stop it first with `apportion dev-cluster stop` (its data goes "
                        "with it), then start again"
                    )
                previous.stop()  # nothing of it runs (a reboot, a SIGKILL): clean up, start anew
        claim(layout)
        started: list[ProcessRecord] = []
        try:
            if real_node:
                clean_up_abandoned_node()  # its state directory goes too
                host.claim_machine(layout.root)
            state = _start_processes(
                layout,
                bin_dir,
                version,
                started,
                pod_simulator and not real_node,
                detach,
                node_images if real_node else None,
                nodes,
                _Serving(with_registry, dist),
            )
        except BaseException:
            _shutdown(started, layout, bin_dir)
            raise
        return cls(layout, state, owned=not detach)

    @classmethod
    def attach(cls, state_dir: Path | None = None) -> DevCluster:
        """The cluster recorded in `state_dir` (default: the CLI's), running or not."""
        layout = Layout(Path(state_dir or default_state_dir()).resolve())
        cluster = cls._existing(layout)
        if cluster is None:
            raise DevClusterError(f"no dev-cluster in {layout.root}")
        return cluster

    @classmethod
    def _existing(cls, layout: Layout) -> DevCluster | None:
        state = load_state(layout)
        return None if state is None else cls(layout, state, owned=False)

    def running(self) -> bool:
        return all(processes.is_running(r) for r in self._state.processes)

    def process_status(self) -> dict[str, bool]:
        return {r.name: processes.is_running(r) for r in self._state.processes}

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL) and remove the state directory."""
        if self._finalizer is not None:
            self._finalizer()
        else:
            _shutdown(self._state.processes, self._layout, self.bin_dir)

    def __enter__(self) -> DevCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- what clients need ------------------------------------------------------------------

    @property
    def state_dir(self) -> Path:
        return self._layout.root

    @property
    def kubeconfig(self) -> Path:
        return self._layout.kubeconfig

    @property
    def server(self) -> str:
        return self._state.server

    @property
    def token(self) -> str:
        return self._state.token

    @property
    def ca_file(self) -> Path:
        return self._layout.ca_file

    @property
    def bin_dir(self) -> Path:
        return Path(self._state.bin_dir)

    @property
    def etcd(self) -> str:
        """etcd's client URL (http://127.0.0.1:PORT), with what the API server stores."""
        if self._state.etcd is None:
            raise DevClusterError(f"{self._layout.root} was started before its etcd was recorded")
        return self._state.etcd

    @property
    def registry(self) -> str | None:
        """host:port of the OCI registry (started with `registry=True`), else None. A published
        name `ghcr.io/X:V` is `<registry>/X:V` there (`registry.repository_path`)."""
        return self._state.registry

    @property
    def python_index(self) -> str | None:
        """The PEP 503 index URL over `dist`/python (`pip --index-url`), when started with it."""
        served = self._state.dist_server
        return None if served is None else f"{served}{distserver.INDEX}"

    @property
    def maven_repository(self) -> str | None:
        """The Maven repository URL over `dist`/maven, when started with `dist`."""
        served = self._state.dist_server
        return None if served is None else f"{served}{distserver.MAVEN}"

    @property
    def env(self) -> dict[str, str]:
        """os.environ with KUBECONFIG pointing here and the matching kubectl first on PATH."""
        return cluster_env(os.environ, self.kubeconfig, self.bin_dir)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run this cluster's kubectl; with check, a failure raises KubectlError whose message
        includes kubectl's stderr."""
        argv = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, text=True, capture_output=True, env=self.env, timeout=timeout
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def readyz(self) -> str:
        return http_get(f"{self.server}/readyz", token=self.token, ca_file=self.ca_file)[1]

    def pod_log_path(self, namespace: str, name: str) -> Path:
        """Where a process-simulated pod's stdout and stderr go (appended across restarts)."""
        return self._layout.pod_log(namespace, name)

    def log_path(self, component: str) -> Path:
        """Log of `etcd`, `kube-apiserver`, `kube-controller-manager` or `podsim`."""
        return self._layout.logs / f"{component}.log"

    def lose_node(self, name: str) -> None:
        """What a further real node's machine dying does: its kubelet, containerd and kube-proxy
        and every process of its pods are SIGKILLed. Its network namespace, and what the API
        server knows of it, stay (`stop` cleans up)."""
        records = [r for r in self._state.processes if node.node_of(r.name) == name]
        if not records:
            raise DevClusterError(f"{name} is not a further real node of this cluster")
        processes.terminate(records, grace=0.0)
        host.kill_pods(name)

    def backup_etcd(self, destination: Path) -> Path:
        """A backup of everything the API server stores (`devcluster.restore`)."""
        (etcd,) = (r for r in self._state.processes if r.name == "etcd")
        return restore.backup(etcd, self._layout.etcd_data, destination)

    def restore_etcd(self, backup: Path) -> None:
        """Kubernetes' recovery procedure with `backup` (`devcluster.restore`): the API server
        and the controller manager stopped, etcd's data replaced, all three started again on
        the same addresses; the pod simulator, the nodes and every client keep running."""
        layout, state = self._layout, self._state
        ready = {
            "etcd": lambda: _etcd_healthy(self.etcd),
            "kube-apiserver": lambda: _apiserver_ready(self.server, self.token, self.ca_file),
            "kube-controller-manager": lambda: True,
        }

        def wait(record: ProcessRecord) -> None:
            _wait_until(ready[record.name], [record], f"{record.name} after the restore")

        try:
            restore.restore(
                state.processes,
                layout.etcd_data,
                backup,
                wait,
                attached=self._finalizer is not None,
            )
        finally:
            # Also after a failed restore: `stop` from another shell must find what did start.
            save_state(layout, state)

    def pid(self, component: str) -> int:
        """Process id of a component (`kube-apiserver`, …), e.g. to SIGSTOP it in a test."""
        (record,) = (r for r in self._state.processes if r.name == component)
        return record.pid


def cluster_env(
    base: dict[str, str] | os._Environ[str], kubeconfig: Path, bin_dir: Path
) -> dict[str, str]:
    env = dict(base)
    env["KUBECONFIG"] = str(kubeconfig)
    env["PATH"] = os.pathsep.join(filter(None, [str(bin_dir), env.get("PATH", "")]))
    return env


# --- starting -----------------------------------------------------------------------------


def _start_processes(
    layout: Layout,
    bin_dir: Path,
    version: str,
    started: list[ProcessRecord],
    pod_simulator: bool,
    detach: bool,
    node_images: dict[str, list[str]] | None,
    nodes: int,
    serving: _Serving,
) -> ClusterState:
    """Start the components in order, appending each to `started` as soon as it exists so that a
    failure anywhere stops what is already running. With `node_images`, `nodes` real nodes run
    them; `serving` says which registries run beside them."""
    real_node = node_images is not None
    if real_node:
        host.create_bridge()
    # On a real node the API server listens on the bridge, where pods reach it through the
    # `kubernetes` Service; otherwise on loopback only.
    address = host.GATEWAY if real_node else "127.0.0.1"
    cluster_pki = pki.make_cluster_pki(layout.pki, (address, SERVICE_IP))
    token = new_token()
    write_token_file(layout.token_file, token)
    write_service_account_key(layout.service_account_key)
    attached = not detach

    def spawn(name: str, argv: list[str], env: dict[str, str] | None = None) -> ProcessRecord:
        record = processes.spawn(
            name,
            argv,
            layout.logs / f"{name}.log",
            env=env or dict(os.environ),
            attached=attached,
            # The simulator gets the chance to stop its pod processes.
            orphan_signal=signal.SIGTERM if name == "podsim" else signal.SIGKILL,
        )
        started.append(record)
        return record

    etcd_url = _retry_on_port_clash(lambda: _start_etcd(layout, bin_dir, spawn, started))
    apiserver_flags = cluster_pki.apiserver_flags()
    if not real_node:
        # Since 1.37 the endpoint reconciler refuses a loopback advertise address (the `kubernetes`
        # Service's endpoints could not be reached from a pod). Simulated pods reach the API
        # server by their kubeconfig, never by that Service (podsim.podenv).
        apiserver_flags += ["--authorization-mode=RBAC", "--endpoint-reconciler-type=none"]
    else:
        # The kubelet is a real node user: the Node authorizer and NodeRestriction confine it to
        # its own Node and the objects of its own pods.
        apiserver_flags += [
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--kubelet-preferred-address-types=InternalIP",
            "--enable-aggregator-routing=true",
            *TOLERATION_FLAGS,
        ]
    server = _retry_on_port_clash(
        lambda: _start_apiserver(
            layout, bin_dir, etcd_url, token, spawn, started, address, apiserver_flags
        )
    )
    write_kubeconfig(layout.kubeconfig, server, token, layout.ca_file)
    spawn(
        "kube-controller-manager",
        [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig}",
            f"--service-account-private-key-file={layout.service_account_key}",
            f"--root-ca-file={layout.ca_file}",
            f"--flex-volume-plugin-dir={layout.flexvolume}",
            "--leader-elect=false",
            "--secure-port=0",
            *(NODE_MONITOR_FLAGS if real_node else ()),
        ],
    )
    if pod_simulator:
        spawn(
            "podsim",
            [
                sys.executable,
                "-m",
                "apportion_dev.devcluster.podsim",
                f"--kubeconfig={layout.kubeconfig}",
                f"--state-dir={layout.root}",
                f"--ip-prefix={random_prefix()}",
                f"--kubelet-version={version}",
            ],
        )
    state = ClusterState(
        server=server, token=token, bin_dir=str(bin_dir), processes=started, etcd=etcd_url
    )
    save_state(layout, state)  # from here on, `stop` from another shell finds everything
    if serving.registry:
        # Where the API server listens: every real node's containerd reaches it, further nodes'
        # from their own network namespaces too.
        state.registry = _retry_on_port_clash(
            lambda: _start_registry(layout, address, spawn, started)
        )
    if serving.dist is not None:
        state.dist = str(serving.dist)
        state.dist_server = _retry_on_port_clash(
            lambda: _start_dist_server(serving.dist, spawn, started)  # type: ignore[arg-type]
        )
    save_state(layout, state)
    if serving.dist is not None and state.registry is not None:
        registry.publish(serving.dist, state.registry)
    if node_images is not None:
        node.start_nodes(
            nodes,
            layout.root,
            bin_dir,
            server,
            token,
            cluster_pki,
            spawn,
            _wait_until,
            node.ImageSources(node_images, state.registry),
        )
        save_state(layout, state)

    def settled() -> bool:
        account = f"{server}/api/v1/namespaces/default/serviceaccounts/default"
        if http_get(account, token=token, ca_file=layout.ca_file)[0] != 200:
            return False  # the controller-manager has not got going yet
        if real_node:
            return _metrics_api_available(server, token, layout.ca_file)
        if not pod_simulator:
            return True
        nodes = http_get_json(
            f"{server}/api/v1/nodes?labelSelector={SIM_NODE_LABEL}%3Dtrue",
            token=token,
            ca_file=layout.ca_file,
        )
        if not nodes:
            return False
        return bool(nodes["items"]) and all(_node_ready(n) for n in nodes["items"])

    if real_node:
        _apply(bin_dir, layout.kubeconfig, node.metrics_server_manifest())
    _wait_until(settled, started, "the controller-manager and the node")
    return state


def _apply(bin_dir: Path, kubeconfig: Path, manifest: str) -> None:
    result = subprocess.run(
        [str(bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", "apply", "-f", "-"],
        input=manifest,
        text=True,
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise DevClusterError(f"kubectl apply failed: {result.stderr.strip()}")


def _metrics_api_available(server: str, token: str, ca_file: Path) -> bool:
    service = http_get_json(
        f"{server}/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io",
        token=token,
        ca_file=ca_file,
    )
    if not service:
        return False
    return any(
        c["type"] == "Available" and c["status"] == "True"
        for c in service.get("status", {}).get("conditions", [])
    )


def clean_up_abandoned_node() -> str | None:
    """If this machine's real node belongs to a dev-cluster whose processes are all gone, undo
    what it left (see `host.clean_up`) and return its state directory."""
    record = host.load_record()
    if record is None or _node_owner_alive():
        return None
    layout = Layout(Path(record.owner))
    state = load_state(layout)
    if state is not None:
        _shutdown(state.processes, layout, Path(state.bin_dir))  # also removes its directory
    else:
        host.clean_up(record)
    return record.owner


def _node_owner_alive() -> bool:
    """Whether the dev-cluster that owns this machine's real node still runs."""
    record = host.load_record()
    if record is None:
        return False
    state = load_state(Layout(Path(record.owner)))
    return state is not None and any(processes.is_running(r) for r in state.processes)


def _say(message: str) -> None:
    print(f"[dev-cluster] {message}", file=sys.stderr, flush=True)


def _node_ready(node: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in node.get("status", {}).get("conditions", [])
    )


def _retry_on_port_clash(start: Callable[[], str]) -> str:
    for attempt in range(START_ATTEMPTS):
        try:
            return start()
        except _AddressInUse:
            if attempt == START_ATTEMPTS - 1:
                raise DevClusterError("ports kept being taken by other processes") from None
    raise AssertionError("unreachable")


def _start_etcd(
    layout: Layout,
    bin_dir: Path,
    spawn: Callable[[str, list[str]], ProcessRecord],
    started: list[ProcessRecord],
) -> str:
    client_port, peer_port = free_ports(2)
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    record = spawn(
        "etcd",
        [
            str(bin_dir / "etcd"),
            "--name=default",
            f"--data-dir={layout.etcd_data}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ],
    )

    _wait_or_retry(lambda: _etcd_healthy(client), record, started, "etcd")
    return client


def _etcd_healthy(client: str) -> bool:
    health = http_get_json(f"{client}/health")
    return bool(health and health.get("health") == "true")


def _apiserver_ready(server: str, token: str, ca_file: Path) -> bool:
    if not ca_file.exists():
        return False
    return http_get(f"{server}/readyz", token=token, ca_file=ca_file) == (200, "ok")


def _version_of(bin_dir: Path) -> str:
    """`Kubernetes v1.30.14` → `v1.30.14`, as the API server says it."""
    said = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    return said.split()[-1]


def _start_apiserver(
    layout: Layout,
    bin_dir: Path,
    etcd_url: str,
    token: str,
    spawn: Callable[[str, list[str]], ProcessRecord],
    started: list[ProcessRecord],
    address: str,
    extra_flags: list[str],
) -> str:
    (port,) = free_ports(1)
    server = f"https://{address}:{port}"
    record = spawn(
        "kube-apiserver",
        [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--cert-dir={layout.pki}",
            f"--secure-port={port}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            f"--token-auth-file={layout.token_file}",
            f"--service-account-issuer={server}",
            f"--service-account-key-file={layout.service_account_key}",
            f"--service-account-signing-key-file={layout.service_account_key}",
            *extra_flags,
        ],
    )

    _wait_or_retry(
        lambda: _apiserver_ready(server, token, layout.ca_file), record, started, "kube-apiserver"
    )
    return server


def _start_registry(
    layout: Layout,
    address: str,
    spawn: Callable[..., ProcessRecord],
    started: list[ProcessRecord],
) -> str:
    (port,) = free_ports(1, address)
    config = registry.write_config(layout.registry, address, port)
    record = spawn("registry", registry.argv(config), registry.env())
    served = f"{address}:{port}"
    _wait_or_retry(lambda: registry.ready(served), record, started, "the registry")
    return served


def _start_dist_server(
    dist: Path, spawn: Callable[..., ProcessRecord], started: list[ProcessRecord]
) -> str:
    """The package index and Maven repository over `dist`, on loopback (see distserver)."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    record = spawn(
        "distserver",
        [
            sys.executable,
            "-m",
            "apportion_dev.devcluster.distserver",
            f"--dist={dist}",
            "--address=127.0.0.1",
            f"--port={port}",
        ],
    )
    _wait_or_retry(
        lambda: http_get(f"{url}{distserver.INDEX}")[0] == 200, record, started, "distserver"
    )
    return url


def _wait_or_retry(
    check: Callable[[], bool], record: ProcessRecord, started: list[ProcessRecord], what: str
) -> None:
    """Wait for `check`; if the process died because its port was taken, forget it and raise
    _AddressInUse so the caller retries with other ports."""
    try:
        _wait_until(check, [record], what)
    except DevClusterError:
        # Go says "address already in use", Python "Address already in use".
        if (
            not processes.is_running(record)
            and "address already in use" in processes.log_tail(record, 200).lower()
        ):
            started.remove(record)
            raise _AddressInUse() from None
        raise


def _wait_until(check: Callable[[], bool], watched: Sequence[ProcessRecord], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while not check():
        for record in watched:
            if not processes.is_running(record):
                raise DevClusterError(
                    f"{record.name} exited while starting; last lines of {record.log}:\n"
                    f"{processes.log_tail(record)}"
                )
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {r.log}\n{processes.log_tail(r, 10)}" for r in watched)
            raise DevClusterError(f"{what} not ready after {READY_TIMEOUT:.0f}s\n{tails}")
        time.sleep(0.1)
