"""Argo CD on a dev-cluster: Redis (Debian's redis-server) and Argo CD's repo-server,
application-controller and applicationset-controller (the multi-call binary built from its Go
module, `tools.ARGOCD`) as host processes against the cluster's API server, installed the way a
user installs Argo CD and apportion's health checks.

    with ArgoCD.start(cluster, state_dir) as argocd:  # CRDs, argocd-cm, processes ready
        ...                                          # Application / ApplicationSet objects
        argocd.refresh("app")                        # compare with Git now (a new commit)

From the argo-cd module at the version built (`source_dir`): its CRDs (`manifests/crds`) and
its install's configuration (`manifests/base/config`: argocd-cm with Argo CD's defaults,
argocd-secret, argocd-rbac-cm, argocd-cmd-params-cm...), into the namespace `argocd`; then
`manifests/argocd/argocd-cm-patch.yaml` patched into argocd-cm as docs/gitops.md tells users to.
There is no argocd-server (no UI, API or webhooks): it would create the AppProject `default` at
start, so `install` creates it as the server does; a new commit is seen on `refresh` (the
annotation `argocd app get --refresh` sets) rather than by a webhook; and the
application-controller keeps each object's health in the Application's status, where Argo CD 3
otherwise keeps it in Redis for the server's resource tree.

Out of a pod, the components reach the cluster through `$KUBECONFIG` with
ARGOCD_FAKE_IN_CLUSTER=true, which makes the in-cluster destination
(https://kubernetes.default.svc) use it too, as Argo CD's own local runs do (its Procfile). The
repo-server finds git, helm (`tools.HELM`) and kustomize (`tools.KUSTOMIZE`) on PATH, and its
gRPC uses the self-signed certificate it makes at start, unverified by the controllers, as in a
default install. Ports are free loopback ports, except that the application-controller binds its
metrics port on every address (it has no flag for the address).

Applications carrying the resources finalizer delete what they applied when they are deleted;
`stop` deletes every ApplicationSet and Application while the controllers still run, so nothing
is left Terminating."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml

from apportion_dev.devcluster.build import go_env
from apportion_dev.devcluster.hostcontrollers import (
    HostControllers,
    accepts,
    http_ok,
    wait_established,
)
from apportion_dev.devcluster.net import free_ports
from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.processes import spawn
from apportion_dev.devcluster.tools import (
    ARGOCD,
    HELM,
    KUSTOMIZE,
    ensure_tool,
    tool_build,
    tool_module_dir,
)

NAMESPACE = "argocd"
CRDS = ("applications.argoproj.io", "appprojects.argoproj.io", "applicationsets.argoproj.io")
HEALTH_PATCH = Path(__file__).resolve().parents[3] / "manifests" / "argocd" / "argocd-cm-patch.yaml"
REFRESH = "argocd.argoproj.io/refresh"
DEFAULT_PROJECT = {
    # what argocd-server creates when it starts and finds no project `default`
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "AppProject",
    "metadata": {"name": "default", "namespace": NAMESPACE},
    "spec": {
        "sourceRepos": ["*"],
        "destinations": [{"server": "*", "namespace": "*"}],
        "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
    },
}


def source_dir() -> Path:
    """The argo-cd module's files at the version the wrapper module pins (the Go module cache,
    downloaded if missing)."""
    version = tool_build(ARGOCD).stamp[ARGOCD.name]
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{ARGOCD.module_path}@{version}"],
        cwd=tool_module_dir(ARGOCD),
        env=go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise DevClusterError(f"cannot download {ARGOCD.module_path}@{version}: {result.stderr}")
    return Path(json.loads(result.stdout)["Dir"])


def install(cluster: Any, source: Path) -> None:
    """Argo CD's CRDs and configuration, apportion's health checks, the project `default`."""
    kubectl = cluster.kubectl
    # server-side: the ApplicationSet CRD is too large for the last-applied annotation
    kubectl("apply", "--server-side", "-k", str(source / "manifests" / "crds"))
    wait_established(cluster, CRDS)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    kubectl("apply", "-f", "-", input=json.dumps(namespace))
    kubectl("apply", "-n", NAMESPACE, "-k", str(source / "manifests" / "base" / "config"))
    kubectl("patch", "-n", NAMESPACE, "configmap", "argocd-cm", "--patch-file", str(HEALTH_PATCH))
    kubectl("apply", "-f", "-", input=yaml.safe_dump(DEFAULT_PROJECT))


class ArgoCD(HostControllers):
    @classmethod
    def start(cls, cluster: Any, state_dir: Path, *, timeout: float = 90.0) -> ArgoCD:
        redis_server = shutil.which("redis-server")
        if redis_server is None:
            raise DevClusterError(
                "redis-server is missing: `sh scripts/native-deps.sh` installs Debian's"
            )
        argocd = ensure_tool(ARGOCD) / "argocd"
        path = [str(ensure_tool(KUSTOMIZE)), str(ensure_tool(HELM))]
        install(cluster, source_dir())
        state_dir.mkdir(parents=True, exist_ok=True)
        home, tmp, tls, ssh = (state_dir / name for name in ("home", "tmp", "tls", "ssh"))
        for directory in (home, tmp, tls, ssh):
            directory.mkdir(exist_ok=True)
        redis, repo, repo_metrics, app_metrics, set_metrics, set_probe, set_webhook = free_ports(7)
        env = {
            **cluster.env,
            # nothing of the user's: helm's and git's configuration, the clones
            "HOME": str(home),
            "TMPDIR": str(tmp),
            "ARGOCD_FAKE_IN_CLUSTER": "true",
            "ARGOCD_TLS_DATA_PATH": str(tls),
            "ARGOCD_SSH_DATA_PATH": str(ssh),
            "ARGOCD_GPG_ENABLED": "false",
            "ARGOCD_ASK_PASS_SOCK": str(state_dir / "askpass.sock"),
        }
        env["PATH"] = os.pathsep.join([*path, env["PATH"]])
        cache = f"--redis=127.0.0.1:{redis}"
        repo_server = f"127.0.0.1:{repo}"
        components = {
            "argocd-repo-server": [
                "--address=127.0.0.1",
                f"--port={repo}",
                "--metrics-address=127.0.0.1",
                f"--metrics-port={repo_metrics}",
                cache,
            ],
            "argocd-application-controller": [
                f"--namespace={NAMESPACE}",
                f"--repo-server={repo_server}",
                f"--metrics-port={app_metrics}",
                # Each object's health in the Application's status, as before Argo CD 3.0
                # (`controller.resource.health.persist` of argocd-cmd-params-cm): since, it is
                # kept in Redis for argocd-server's resource tree, which does not run here.
                "--persist-resource-health",
                cache,
            ],
            "argocd-applicationset-controller": [
                f"--namespace={NAMESPACE}",
                f"--argocd-repo-server={repo_server}",
                f"--metrics-addr=127.0.0.1:{set_metrics}",
                f"--probe-addr=127.0.0.1:{set_probe}",
                f"--webhook-addr=127.0.0.1:{set_webhook}",
            ],
        }
        records = [
            spawn(
                "redis",
                # a cache: nothing kept on disk
                [redis_server, "--bind", "127.0.0.1", "--port", str(redis), "--save", ""],
                state_dir / "redis.log",
                orphan_signal=signal.SIGTERM,
            ),
            *(
                spawn(
                    name,
                    [str(argocd), *flags],
                    state_dir / f"{name}.log",
                    env={**env, "ARGOCD_BINARY_NAME": name},
                    orphan_signal=signal.SIGTERM,
                )
                for name, flags in components.items()
            ),
        ]
        ready = {
            "redis": accepts(redis),
            # the repo-server's /healthz answers once its own gRPC server does
            "argocd-repo-server": http_ok(f"http://127.0.0.1:{repo_metrics}/healthz"),
            "argocd-application-controller": http_ok(f"http://127.0.0.1:{app_metrics}/healthz"),
            # it registers no health checks: its metrics answer once its manager runs
            "argocd-applicationset-controller": http_ok(f"http://127.0.0.1:{set_metrics}/metrics"),
        }
        return cls.started(cluster, records, ready, timeout)

    def refresh(self, name: str) -> None:
        """Have the application-controller compare Application `name` with Git now."""
        self.cluster.kubectl(
            "annotate", "--overwrite", "-n", NAMESPACE, "application", name, f"{REFRESH}=normal"
        )

    def application(self, name: str) -> dict[str, Any]:
        return self.get("application", NAMESPACE, name)

    def stop(self) -> None:
        """Delete every ApplicationSet and Application (their finalizers need the controllers),
        then stop the processes."""
        if any(self.running().values()):
            for kind in ("applicationsets", "applications"):
                self.cluster.kubectl(
                    "delete", kind, "--all", "-n", NAMESPACE, "--timeout=120s", check=False
                )
        self.terminate()
