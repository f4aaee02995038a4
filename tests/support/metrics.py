"""E2E helpers for load figures, for any test that needs PodMetrics or worker metrics.

    from tests.support.metrics import pod_metrics_api, publish_pod_metrics, metrics_server_pod

    def test_x(pod_metrics_api, kubectl, namespace):      # the test CRD serves metrics.k8s.io
        publish_pod_metrics(kubectl, namespace, "worker-0", cpu="250m", memory="128Mi")

pod_metrics_api  (session fixture) installs tests/e2e/manifests/podmetrics-crd.yaml: a CRD
                 serving `metrics.k8s.io/v1beta1` PodMetrics (annotated `unapproved, testing
                 only`), so the operator reads them through the real API path. Waits until lists
                 are served. Objects are per namespace, gone with the test's namespace.
publish_pod_metrics(kubectl, namespace, pod, cpu=..., memory=..., containers=None)
                 creates or replaces the pod's PodMetrics, stamped now (a new sample each call).
metrics_server_pod(name, directory, port, labels=...)
                 a Pod manifest whose process (pod simulator process mode) serves the files of
                 `directory` over HTTP on its own pod IP: write a page rendered with
                 `apportion.api.worker_report.WorkerReport(...).render()` to
                 `directory/metrics` and the pod serves it at `/metrics` on container port
                 `metrics`; rewrite the file to change what it reports. Its requests are
                 logged to the pod's log file.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from tests.support.waiting import wait_for

POD_METRICS_CRD = Path(__file__).parents[1] / "e2e" / "manifests" / "podmetrics-crd.yaml"
POD_METRICS_CRD_NAME = "pods.metrics.k8s.io"


def install_pod_metrics_api(cluster: DevCluster, wait_for: Callable[..., Any]) -> None:
    """Apply the test CRD and wait until PodMetrics lists are served."""
    cluster.kubectl("apply", "-f", str(POD_METRICS_CRD))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", f"crd/{POD_METRICS_CRD_NAME}"
    )
    wait_for(
        lambda: (
            cluster.kubectl(
                "get", "--raw", "/apis/metrics.k8s.io/v1beta1/pods", check=False
            ).returncode
            == 0
        ),
        timeout=30,
        message="metrics.k8s.io PodMetrics never served lists",
    )


def remove_pod_metrics_api(cluster: DevCluster, wait_for: Callable[..., Any]) -> None:
    """Delete the test CRD (and every PodMetrics) and wait until the API is gone."""
    cluster.kubectl("delete", "crd", POD_METRICS_CRD_NAME, "--ignore-not-found", "--wait=true")
    wait_for(
        lambda: (
            cluster.kubectl(
                "get", "--raw", "/apis/metrics.k8s.io/v1beta1/pods", check=False
            ).returncode
            != 0
        ),
        timeout=30,
        message="metrics.k8s.io still served after deleting its CRD",
    )


@pytest.fixture(scope="session")
def pod_metrics_api(dev_cluster: DevCluster) -> None:
    install_pod_metrics_api(dev_cluster, wait_for)


def publish_pod_metrics(
    kubectl: Callable[..., Any],
    namespace: str,
    pod: str,
    *,
    cpu: str = "0",
    memory: str = "0",
    containers: Mapping[str, tuple[str, str]] | None = None,
    window: str = "10s",
) -> dict[str, Any]:
    """Create or replace `pod`'s PodMetrics as metrics-server would, timestamped now. One
    container `app` with `cpu`/`memory`, or `containers` = {name: (cpu, memory)}."""
    usages = containers or {"app": (cpu, memory)}
    obj = {
        "apiVersion": "metrics.k8s.io/v1beta1",
        "kind": "PodMetrics",
        "metadata": {"name": pod, "namespace": namespace},
        "timestamp": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "window": window,
        "containers": [
            {"name": name, "usage": {"cpu": c, "memory": m}} for name, (c, m) in usages.items()
        ],
    }
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(obj))
    return obj


def metrics_server_pod(
    name: str,
    directory: Path,
    port: int,
    *,
    labels: Mapping[str, str] | None = None,
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A Pod whose process serves `directory` on `$(POD_IP):port` (container port `metrics`),
    Ready once it answers. Python's http.server: no dependency, one log line per request."""
    container: dict[str, Any] = {
        "name": "app",
        "image": "python:3.11",
        "command": [
            sys.executable,
            "-m",
            "http.server",
            "--bind",
            "$(POD_IP)",
            "--directory",
            str(directory),
            str(port),
        ],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "metrics", "containerPort": port}],
        # The probe asks for the directory listing, so /metrics requests are scrapes only.
        "readinessProbe": {"httpGet": {"path": "/", "port": "metrics"}, "periodSeconds": 1},
    }
    if resources:
        container["resources"] = dict(resources)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": dict(labels or {"app": "metrics-worker"}),
            "annotations": {"apportion.dev/simulate": "process"},
        },
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
    }
