"""The dev-cluster's real node, timed: cluster start (images checked, node Ready, metrics-server
Available), kubelet start to Node Ready, pod create to Ready, a 10-replica Deployment, pod
deletion (SIGTERM to gone), the operator installed from its manifests, and stop with clean-up.

Needs Linux and root (one real node per machine: not while another runs).
Run: .venv/bin/python -m bench.bench_real_node [--quick]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.realnode.host import why_not
from apportion_dev.devcluster.realnode.images import IMAGE
from apportion_dev.devcluster.realnode.node import NODE_NAME

REPO = Path(__file__).resolve().parents[1]
KLOG_TIME = re.compile(r"^[IWE](\d{4}) (\d\d:\d\d:\d\d\.\d+)", re.MULTILINE)


def pod(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "containers": [
                    {
                        "name": "main",
                        "image": IMAGE,
                        "command": ["python3", "-c", "import time; time.sleep(3600)"],
                    }
                ],
            },
        }
    )


def timed(action) -> float:
    began = time.monotonic()
    action()
    return time.monotonic() - began


def kubelet_to_ready(cluster: DevCluster) -> float:
    """First kubelet log line to the Node's Ready transition (whole seconds in the API)."""
    first = KLOG_TIME.search(cluster.log_path("kubelet").read_text())
    assert first is not None
    year = datetime.now(UTC).year
    started = datetime.strptime(f"{year}{first[1]} {first[2]}", "%Y%m%d %H:%M:%S.%f")
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    became = datetime.strptime(ready["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")
    return (became - started.replace(microsecond=0)).total_seconds()


def deployment(cluster: DevCluster) -> float:
    kubectl = cluster.kubectl
    command = ["python3", "-c", "import time; time.sleep(3600)"]
    began = time.monotonic()
    kubectl("create", "deployment", "bench", f"--image={IMAGE}", "--replicas=10", "--", *command)
    kubectl("rollout", "status", "deployment/bench", "--timeout=300s", timeout=320)
    took = time.monotonic() - began
    kubectl("delete", "deployment", "bench", "--wait=false")
    return took


def operator(cluster: DevCluster) -> float:
    """`kubectl apply -k manifests/`, as the e2e tests do, until both replicas are Ready."""
    began = time.monotonic()
    cluster.kubectl("apply", "-k", str(REPO / "manifests"))
    cluster.kubectl(
        "rollout",
        "status",
        "-n",
        "apportion-system",
        "statefulset/apportion-operator",
        "--timeout=300s",
        timeout=320,
    )
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 single pods instead of 10")
    args = parser.parse_args()
    reason = why_not()
    if reason:
        print(f"bench_real_node: no real node here: {reason}")
        return 0
    rows: list[tuple[str, str]] = []
    began = time.monotonic()
    cluster = DevCluster.start(real_node=True)
    rows.append(
        (
            "cluster start, images cached (until metrics-server Available)",
            f"{time.monotonic() - began:.1f} s",
        )
    )
    try:
        rows.append(
            (
                "kubelet start → Node Ready",
                f"< {max(1.0, kubelet_to_ready(cluster) + 1):.0f} s (the API keeps whole seconds)",
            )
        )
        kubectl = cluster.kubectl
        singles = []
        for n in range(3 if args.quick else 10):
            name = f"bench-{n}"
            singles.append(
                timed(
                    lambda name=name: (
                        kubectl("apply", "-f", "-", input=pod(name)),
                        kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s"),
                    )
                )
            )
        rows.append(
            (
                "pod create → Ready (kubectl apply + wait)",
                f"median {statistics.median(singles):.2f} s, max {max(singles):.2f} s",
            )
        )
        deletions = [
            timed(lambda n=n: kubectl("delete", "pod", f"bench-{n}", "--wait=true"))
            for n in range(len(singles))
        ]
        rows.append(
            (
                "pod delete → gone (PID 1 ignores SIGTERM: 5 s grace, then SIGKILL)",
                f"median {statistics.median(deletions):.2f} s",
            )
        )
        rows.append(("10-replica Deployment → all Ready", f"{deployment(cluster):.1f} s"))
        rows.append(("operator from manifests → HA pair Ready", f"{operator(cluster):.1f} s"))
    finally:
        rows.append(("stop, machine cleaned up", f"{timed(cluster.stop):.1f} s"))
    width = max(len(what) for what, _ in rows)
    print(f"{'real node (2 cores)':<{width}}  figure")
    for what, figure in rows:
        print(f"{what:<{width}}  {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
