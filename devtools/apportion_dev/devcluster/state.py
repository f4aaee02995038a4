"""The state directory of one dev-cluster: where everything it writes lives, and the state file
that lets `stop`/`status`/`kubeconfig` from another shell find a running cluster."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.processes import ProcessRecord

STATE_FILE = "state.json"
MARKER = ".apportion-dev-cluster"


def default_state_dir() -> Path:
    """$APPORTION_DEV_CLUSTER_DIR, else $XDG_STATE_HOME/apportion/dev-cluster (~/.local/state)."""
    override = os.environ.get("APPORTION_DEV_CLUSTER_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "apportion" / "dev-cluster"


@dataclass(frozen=True)
class Layout:
    """Paths inside a state directory."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def ca_file(self) -> Path:
        # The cluster's own CA (apportion_dev.devcluster.pki), which signed the serving certificate.
        return self.pki / "ca.crt"

    @property
    def service_account_key(self) -> Path:
        return self.pki / "service-account.key"

    @property
    def token_file(self) -> Path:
        return self.pki / "tokens.csv"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    @property
    def registry(self) -> Path:
        """The OCI registry's configuration and storage (apportion_dev.devcluster.registry)."""
        return self.root / "registry"

    @property
    def flexvolume(self) -> Path:
        # kube-controller-manager creates its FlexVolume plugin directory if missing: keep it here
        # rather than under /usr/libexec.
        return self.root / "flexvolume"

    def pod_log(self, namespace: str, name: str) -> Path:
        return self.pods / namespace / f"{name}.log"


@dataclass
class ClusterState:
    server: str
    token: str
    bin_dir: str
    processes: list[ProcessRecord] = field(default_factory=list)
    registry: str | None = None
    """host:port of the OCI registry, when started (`--registry`)."""
    dist: str | None = None
    """The release directory the package index and Maven repository serve (`--dist`)."""
    dist_server: str | None = None
    """http://host:port of the server of `dist`."""
    etcd: str | None = None
    """etcd's client URL: what the API server stores, read without the API server (a test of
    the bytes a CRD's storage version writes)."""

    def to_json(self) -> dict[str, object]:
        return {
            "server": self.server,
            "token": self.token,
            "bin_dir": self.bin_dir,
            "processes": [p.to_json() for p in self.processes],
            "registry": self.registry,
            "dist": self.dist,
            "dist_server": self.dist_server,
            "etcd": self.etcd,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ClusterState:
        return cls(
            server=str(data["server"]),
            token=str(data["token"]),
            bin_dir=str(data["bin_dir"]),
            processes=[ProcessRecord.from_json(p) for p in data["processes"]],  # type: ignore[attr-defined]
            registry=_optional(data.get("registry")),
            dist=_optional(data.get("dist")),
            dist_server=_optional(data.get("dist_server")),
            etcd=_optional(data.get("etcd")),
        )


def _optional(value: object) -> str | None:
    return None if value is None else str(value)


def save_state(layout: Layout, state: ClusterState) -> None:
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(layout.state_file)


def load_state(layout: Layout) -> ClusterState | None:
    try:
        return ClusterState.from_json(json.loads(layout.state_file.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        raise DevClusterError(f"{layout.state_file} is unreadable: {error}") from error


def claim(layout: Layout) -> None:
    """Make `layout.root` ours: create it, or accept it when empty or left by a dev-cluster.
    Never take over a directory with other content, because `stop` deletes it."""
    root = layout.root
    if root.exists():
        if (root / MARKER).exists():
            release(layout)
        elif any(root.iterdir()):
            raise DevClusterError(
                f"{root} is not empty and was not made by a dev-cluster; choose another --state-dir"
            )
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    (root / MARKER).touch()
    for directory in (layout.pki, layout.logs, layout.pods):
        directory.mkdir(mode=0o700, exist_ok=True)


def release(layout: Layout) -> None:
    """Delete a state directory this harness made (checked by its marker). Never through a
    mount: a real node's pod volumes are mounted below it, and deleting into a bind mount would
    delete what it shows."""
    if not (layout.root / MARKER).exists():
        return
    mounted = mounts_under(layout.root)
    if mounted:
        raise DevClusterError(
            f"{layout.root} still has {len(mounted)} mounts (e.g. {mounted[0]}); not deleting it: "
            "`umount -R` them, then remove it"
        )
    shutil.rmtree(layout.root, ignore_errors=True)


def mountpoints() -> list[str]:
    """Every mount point of this mount namespace (mountinfo escapes spaces and the like as
    octal, which unicode_escape undoes)."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line.split()[4].encode().decode("unicode_escape") for line in lines]


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`."""
    prefix = str(root).rstrip("/") + "/"
    return [p for p in mountpoints() if p == str(root) or p.startswith(prefix)]
