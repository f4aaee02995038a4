"""Flux on a dev-cluster: source-controller and kustomize-controller (built from their Go modules,
`tools.FLUX_TOOLS`) as host processes against the cluster's API server, with their CRDs
(devtools/flux/crds, copied from the controllers' modules at the versions built).

    with Flux.start(cluster, state_dir) as flux:   # CRDs applied, both controllers ready
        ...                                        # GitRepository / Kustomization objects
        flux.reconcile_now("GitRepository", "flux-system", "app")

Out of cluster, the controllers read only `$KUBECONFIG` (they have no --kubeconfig flag), so
they run with `cluster.env`. Everything listens on free loopback ports: metrics, health and
source-controller's artifact server, whose address (--storage-adv-addr) is what it writes into
`.status.artifact.url` and kustomize-controller downloads from. Leader election is off (one
replica each) and there is no notification-controller (Events go to the API server only).

Flux's own objects carry the finalizer `finalizers.fluxcd.io`: `stop` deletes every
GitRepository and Kustomization first, while the controllers still run, so nothing is left
Terminating. A Kustomization with `prune: true` deletes what it applied when it is deleted; set
`keep_applied=True` to suspend pruning first."""

from __future__ import annotations

import datetime
import json
import signal
from pathlib import Path
from typing import Any

from apportion_dev.devcluster.hostcontrollers import HostControllers, http_ok, wait_established
from apportion_dev.devcluster.net import free_ports
from apportion_dev.devcluster.processes import spawn
from apportion_dev.devcluster.tools import (
    FLUX_KUSTOMIZE_CONTROLLER,
    FLUX_SOURCE_CONTROLLER,
    ensure_tool,
)

CRD_DIR = Path(__file__).resolve().parents[2] / "flux" / "crds"
CRDS = (
    # source-controller refuses to start unless every kind it reconciles is served;
    # ExternalArtifact is feature-gated off and not needed.
    "gitrepositories.source.toolkit.fluxcd.io",
    "helmrepositories.source.toolkit.fluxcd.io",
    "helmcharts.source.toolkit.fluxcd.io",
    "buckets.source.toolkit.fluxcd.io",
    "ocirepositories.source.toolkit.fluxcd.io",
    "kustomizations.kustomize.toolkit.fluxcd.io",
)
REQUESTED_AT = "reconcile.fluxcd.io/requestedAt"
"""Annotating a Flux object with a new value makes its controller reconcile it at once. For a new
commit, annotate the GitRepository: the Kustomization follows its source's artifact revision."""


def install_crds(cluster: Any) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_DIR))
    wait_established(cluster, CRDS)


class Flux(HostControllers):
    @classmethod
    def start(cls, cluster: Any, state_dir: Path, *, timeout: float = 60.0) -> Flux:
        source_bin = ensure_tool(FLUX_SOURCE_CONTROLLER) / "source-controller"
        kustomize_bin = ensure_tool(FLUX_KUSTOMIZE_CONTROLLER) / "kustomize-controller"
        install_crds(cluster)
        state_dir.mkdir(parents=True, exist_ok=True)
        storage = state_dir / "storage"
        storage.mkdir(exist_ok=True)
        sc_metrics, sc_health, sc_storage, kc_metrics, kc_health = free_ports(5)
        common = ["--watch-all-namespaces=true", "--enable-leader-election=false"]
        records = [
            spawn(
                "source-controller",
                [
                    str(source_bin),
                    *common,
                    f"--metrics-addr=127.0.0.1:{sc_metrics}",
                    f"--health-addr=127.0.0.1:{sc_health}",
                    f"--storage-path={storage}",
                    f"--storage-addr=127.0.0.1:{sc_storage}",
                    f"--storage-adv-addr=127.0.0.1:{sc_storage}",
                ],
                state_dir / "source-controller.log",
                env=cluster.env,
                orphan_signal=signal.SIGTERM,
            ),
            spawn(
                "kustomize-controller",
                [
                    str(kustomize_bin),
                    *common,
                    f"--metrics-addr=127.0.0.1:{kc_metrics}",
                    f"--health-addr=127.0.0.1:{kc_health}",
                ],
                state_dir / "kustomize-controller.log",
                env=cluster.env,
                orphan_signal=signal.SIGTERM,
            ),
        ]
        ready = {
            "source-controller": http_ok(f"http://127.0.0.1:{sc_health}/readyz"),
            "kustomize-controller": http_ok(f"http://127.0.0.1:{kc_health}/readyz"),
        }
        return cls.started(cluster, records, ready, timeout)

    def reconcile_now(self, kind: str, namespace: str, name: str) -> None:
        stamp = datetime.datetime.now(datetime.UTC).isoformat()
        self.cluster.kubectl(
            "annotate", "--overwrite", "-n", namespace, kind, name, f"{REQUESTED_AT}={stamp}"
        )

    def stop(self, *, keep_applied: bool = False) -> None:
        """Delete every Kustomization and GitRepository (their finalizers need the controllers),
        then stop the controllers."""
        kubectl = self.cluster.kubectl
        if any(self.running().values()):
            if keep_applied:
                listed = kubectl("get", "kustomizations", "-A", "-o", "json", check=False).stdout
                for item in json.loads(listed or '{"items": []}')["items"]:
                    meta = item["metadata"]
                    kubectl(
                        "patch",
                        "-n",
                        meta["namespace"],
                        "kustomization",
                        meta["name"],
                        "--type=merge",
                        "-p",
                        '{"spec":{"prune":false}}',
                        check=False,
                    )
            for kind in ("kustomizations", "gitrepositories"):
                kubectl("delete", kind, "--all", "-A", "--timeout=60s", check=False)
        self.terminate()
