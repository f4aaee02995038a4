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
from pathlib import Path
from types import TracebackType

from apportion.devcluster import processes
from apportion.devcluster.build import Progress, ensure_built
from apportion.devcluster.credentials import (
    new_token,
    write_service_account_key,
    write_token_file,
)
from apportion.devcluster.kubeconfig import write_kubeconfig
from apportion.devcluster.net import free_ports, http_get, http_get_json
from apportion.devcluster.paths import DevClusterError, module_versions
from apportion.devcluster.podsim.ipam import random_prefix
from apportion.devcluster.podsim.objects import SIM_NODE_LABEL
from apportion.devcluster.processes import ProcessRecord
from apportion.devcluster.state import (
    ClusterState,
    Layout,
    claim,
    default_state_dir,
    load_state,
    release,
    save_state,
)

# Controllers that need a cloud provider; everything else kube-controller-manager runs by default.
CLOUD_CONTROLLERS = (
    "cloud-node-lifecycle-controller",
    "node-route-controller",
    "service-lb-controller",
)
SERVICE_CIDR = "10.0.0.0/24"
START_ATTEMPTS = 3  # a free port can be taken by someone else before we bind it
READY_TIMEOUT = 90.0
KEEP_STATE_ENV = "APPORTION_KEEP_STATE"
# Stop order: the simulator first (it stops pod processes), etcd last.
STOP_ORDER = (("podsim",), ("kube-controller-manager", "kube-apiserver"), ("etcd",))


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr or ''}".rstrip()


class _AddressInUse(Exception):
    pass


def _shutdown(records: Sequence[ProcessRecord], layout: Layout) -> None:
    """Stop processes in dependency order, then delete the state directory (unless
    APPORTION_KEEP_STATE is set, to read logs after a failure)."""
    for names in STOP_ORDER:
        processes.terminate([r for r in records if r.name in names])
    processes.terminate([r for r in records if not any(r.name in n for n in STOP_ORDER)])
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
            weakref.finalize(self, _shutdown, list(state.processes), layout) if owned else None
        )

    # --- lifecycle --------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        state_dir: Path | None = None,
        pod_simulator: bool = True,
        *,
        detach: bool = False,
        progress: Progress | None = None,
    ) -> DevCluster:
        """Build the binaries if needed, start everything, wait until it works.

        state_dir: where data, logs, pod logs and the kubeconfig go; a fresh temporary directory
            when None. An existing directory must be empty or an earlier dev-cluster's.
        detach: leave the processes running after this interpreter exits (the CLI's `start`);
            otherwise they stop with it at the latest.
        """
        bin_dir = ensure_built(progress)
        version = module_versions().kubernetes
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
            state = _start_processes(layout, bin_dir, version, started, pod_simulator, detach)
        except BaseException:
            _shutdown(started, layout)
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
            _shutdown(self._state.processes, self._layout)

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
) -> ClusterState:
    """Start the components in order, appending each to `started` as soon as it exists so that a
    failure anywhere stops what is already running."""
    token = new_token()
    write_token_file(layout.token_file, token)
    write_service_account_key(layout.service_account_key)
    attached = not detach

    def spawn(name: str, argv: list[str]) -> ProcessRecord:
        record = processes.spawn(
            name,
            argv,
            layout.logs / f"{name}.log",
            env=dict(os.environ),
            attached=attached,
            # The simulator gets the chance to stop its pod processes.
            orphan_signal=signal.SIGTERM if name == "podsim" else signal.SIGKILL,
        )
        started.append(record)
        return record

    etcd_url = _retry_on_port_clash(lambda: _start_etcd(layout, bin_dir, spawn, started))
    server = _retry_on_port_clash(
        lambda: _start_apiserver(layout, bin_dir, etcd_url, token, spawn, started)
    )
    write_kubeconfig(layout.kubeconfig, server, token, layout.ca_file)
    spawn(
        "kube-controller-manager",
        [
            str(bin_dir / "kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig}",
            f"--service-account-private-key-file={layout.service_account_key}",
            f"--root-ca-file={layout.ca_file}",
            f"--controllers=*,{','.join('-' + c for c in CLOUD_CONTROLLERS)}",
            f"--flex-volume-plugin-dir={layout.flexvolume}",
            "--leader-elect=false",
            "--secure-port=0",
        ],
    )
    if pod_simulator:
        spawn(
            "podsim",
            [
                sys.executable,
                "-m",
                "apportion.devcluster.podsim",
                f"--kubeconfig={layout.kubeconfig}",
                f"--state-dir={layout.root}",
                f"--ip-prefix={random_prefix()}",
                f"--kubelet-version={version}",
            ],
        )
    state = ClusterState(server=server, token=token, bin_dir=str(bin_dir), processes=list(started))
    save_state(layout, state)

    def settled() -> bool:
        account = f"{server}/api/v1/namespaces/default/serviceaccounts/default"
        if http_get(account, token=token, ca_file=layout.ca_file)[0] != 200:
            return False  # the controller-manager has not got going yet
        if not pod_simulator:
            return True
        nodes = http_get_json(
            f"{server}/api/v1/nodes?labelSelector={SIM_NODE_LABEL}%3Dtrue",
            token=token,
            ca_file=layout.ca_file,
        )
        return bool(nodes and nodes["items"]) and all(_node_ready(n) for n in nodes["items"])

    _wait_until(settled, started, "the controller-manager and pod simulator")
    return state


def _node_ready(node: dict) -> bool:
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

    def healthy() -> bool:
        health = http_get_json(f"{client}/health")
        return bool(health and health.get("health") == "true")

    _wait_or_retry(healthy, record, started, "etcd")
    return client


def _start_apiserver(
    layout: Layout,
    bin_dir: Path,
    etcd_url: str,
    token: str,
    spawn: Callable[[str, list[str]], ProcessRecord],
    started: list[ProcessRecord],
) -> str:
    (port,) = free_ports(1)
    server = f"https://127.0.0.1:{port}"
    record = spawn(
        "kube-apiserver",
        [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--cert-dir={layout.pki}",
            f"--secure-port={port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--authorization-mode=RBAC",
            f"--token-auth-file={layout.token_file}",
            f"--service-account-issuer={server}",
            f"--service-account-key-file={layout.service_account_key}",
            f"--service-account-signing-key-file={layout.service_account_key}",
        ],
    )

    def ready() -> bool:
        if not layout.ca_file.exists():
            return False
        return http_get(f"{server}/readyz", token=token, ca_file=layout.ca_file) == (200, "ok")

    _wait_or_retry(ready, record, started, "kube-apiserver")
    return server


def _wait_or_retry(
    check: Callable[[], bool], record: ProcessRecord, started: list[ProcessRecord], what: str
) -> None:
    """Wait for `check`; if the process died because its port was taken, forget it and raise
    _AddressInUse so the caller retries with other ports."""
    try:
        _wait_until(check, [record], what)
    except DevClusterError:
        if not processes.is_running(record) and "address already in use" in processes.log_tail(
            record, 200
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
