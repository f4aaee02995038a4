"""`apportion demo`: the operator and its samples on a cluster until Ctrl-C (`make demo`).

Builds what is missing and starts a local dev-cluster — with a real node (kubelet, containerd,
the operator installed from manifests/ as containers of the image built here) where the machine
allows it, else with the pod simulator — or uses the cluster of --kubeconfig / $KUBECONFIG when
it answers; installs the CRDs and the worker role, runs the operator, applies
manifests/samples/ (a PartitionSet of 32 partitions over a 4-pod StatefulSet of demo workers, a
ShardSet of 1000 shards over 3, two GrainTypes over 4 grain silos, and a load generator sending
Zipf-skewed traffic to all three), waits until the sets are Balanced and the GrainTypes Ready and
prints what to try in another shell (docs/tutorial.md walks through it). Ctrl-C stops the
operator and the dev-cluster (on a cluster of yours: removes the samples) and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apportion_dev.devcluster import DevCluster

REPO = Path(__file__).resolve().parents[3]
SAMPLES = (
    "partitionset-demo.yaml",
    "shardset-demo.yaml",
    "graintype-demo.yaml",
    "traffic-demo.yaml",
)
SETS = (
    ("partitionset", "demo"),
    ("shardset", "carts"),
    ("graintype", "cart"),
    ("graintype", "report"),
)
WORKERS = "demo-workers"
OPERATOR_NAMESPACE = "apportion-system"
OPERATOR = "statefulset/apportion-operator"
TRAFFIC = "demo-traffic"
CRD_NAMES = tuple(f"crd/{p}.apportion.dev" for p in ("graintypes", "partitionsets", "shardsets"))


class DemoError(Exception):
    """The demo cannot go on; the message says why and what to look at."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the operator and the samples on a local dev-cluster (make demo)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="use this cluster (default: $KUBECONFIG when it answers, else a local dev-cluster)",
    )
    parser.add_argument(
        "--namespace", "-n", default="default", help="namespace of the samples (default: default)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for the sets to be Balanced (default 300)",
    )
    parser.add_argument(
        "--node",
        choices=("auto", "real", "sim"),
        default="auto",
        help="the local dev-cluster's node: real (kubelet + containerd; Linux, root), sim (the "
        "pod simulator), auto (real where the machine allows it; default)",
    )
    parser.add_argument(
        "--exit-after-ready",
        action="store_true",
        help="stop everything and exit 0 once the sets are Balanced (for tests)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # SIGTERM and SIGHUP (the terminal closed) unwind like Ctrl-C (even where a parent left
    # SIGINT ignored): the operator and the cluster are stopped either way, in order.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    try:
        with _terminal_foreground(), _cluster(args.kubeconfig, args.node) as target:
            _install(target, args.namespace)
            with _operator(target, args.namespace) as operator:
                _wait_balanced(target, args.namespace, operator, args.timeout)
                print(_instructions(target, args.namespace), flush=True)
                if args.exit_after_ready:
                    return 0
                _say("running; Ctrl-C stops everything")
                while (stopped := operator.stopped()) is None:
                    time.sleep(0.5)
                raise DemoError(stopped)
    except KeyboardInterrupt:
        # Stopping on request is the demo's normal end, not a failure of `make demo`.
        _say("stopped on request: the operator, the workers and the cluster are gone")
        return 0
    except DemoError as error:
        print(f"apportion demo: {error}", file=sys.stderr, flush=True)
        return 1


def _interrupt(signum: int, frame: object) -> None:
    # A second Ctrl-C while stopping must not cut the clean-up short.
    for ignored in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(ignored, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextlib.contextmanager
def _terminal_foreground() -> Iterator[None]:
    """Makes the demo the terminal's foreground process group while it runs, so that Ctrl-C
    reaches the demo alone: `make demo` then sees it exit 0 instead of dying of the same SIGINT
    itself (GNU make re-raises it and ends with status 130). Without a terminal: nothing."""
    try:
        tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        yield
        return
    try:
        before = os.tcgetpgrp(tty)
        if before != os.getpgrp():
            yield  # started in the background: the terminal is not ours to take
            return
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        _set_foreground(tty, os.getpgrp())
        try:
            yield
        finally:
            _set_foreground(tty, before)
    finally:
        os.close(tty)


def _set_foreground(tty: int, group: int) -> None:
    # A process group that is not in the foreground gets SIGTTOU for tcsetpgrp.
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(tty, group)
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _say(message: str) -> None:
    # After a hang-up the terminal refuses writes: stopping everything matters more than
    # saying so.
    with contextlib.suppress(OSError):
        print(f"[demo] {message}", flush=True)


# ------------------------------------------------------------------------------- the cluster


@dataclass
class Target:
    """The cluster the demo runs on."""

    kubeconfig: Path
    env: dict[str, str]
    workdir: Path
    local: DevCluster | None
    kubectl_dir: Path | None
    """Directory of the kubectl to put first on PATH (ours), None: the user's."""
    real_node: bool = False
    """The local cluster runs a real node: the operator and workers run as containers."""

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            text=True,
            capture_output=True,
            env=self.env,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise DemoError(f"kubectl {shlex.join(args)} failed:\n{result.stderr.strip()}")
        return result


@contextlib.contextmanager
def _cluster(kubeconfig: Path | None, node: str) -> Iterator[Target]:
    from apportion_dev.devcluster import DevCluster, DevClusterError, ensure_built
    from apportion_dev.devcluster.cluster import cluster_env

    given = kubeconfig or (Path(os.environ["KUBECONFIG"]) if os.environ.get("KUBECONFIG") else None)
    if given is not None:
        kubectl_dir = None if _which("kubectl") else ensure_built()
        env = cluster_env(os.environ, given, kubectl_dir) if kubectl_dir else dict(os.environ)
        env["KUBECONFIG"] = str(given)
        workdir = Path(tempfile.mkdtemp(prefix="apportion-demo-"))
        target = Target(given, env, workdir, None, kubectl_dir)
        if _reachable(target):
            _say(f"using the cluster of {given}")
            yield target
            return
        if kubeconfig is not None:
            raise DemoError(f"the cluster of {kubeconfig} does not answer")
        _say(f"$KUBECONFIG ({given}) does not answer; starting a local dev-cluster instead")
    from apportion_dev.cli.dev_cluster import choose_real_node

    real_node = choose_real_node(node)
    kind = "a real node" if real_node else "the pod simulator"
    _say(f"building what is missing, starting a local dev-cluster with {kind}")
    began = time.monotonic()
    try:
        cluster = DevCluster.start(real_node=real_node, progress=_say)
    except DevClusterError as error:
        raise DemoError(str(error)) from error
    try:
        _say(f"dev-cluster ready in {time.monotonic() - began:.1f}s at {cluster.server}")
        yield Target(
            cluster.kubeconfig, cluster.env, cluster.state_dir, cluster, cluster.bin_dir, real_node
        )
    finally:
        _say("stopping the dev-cluster")
        cluster.stop()


def _which(command: str) -> str | None:
    import shutil

    return shutil.which(command)


def _reachable(target: Target) -> bool:
    try:
        answer = target.kubectl(
            "get", "--raw", "/readyz", "--request-timeout=5s", check=False, timeout=15
        )
    except subprocess.TimeoutExpired:
        return False
    return answer.returncode == 0


def _sample(name: str) -> Path:
    path = REPO / "manifests" / "samples" / name
    if not path.exists():
        raise DemoError(f"{path} is missing: run the demo from a checkout of apportion")
    return path


def _install(target: Target, namespace: str) -> None:
    crds = REPO / "crds"
    if not crds.is_dir():
        raise DemoError(f"{crds} is missing: run the demo from a checkout of apportion")
    _say("installing the CRDs and the worker role")
    target.kubectl("apply", "-f", str(crds))
    target.kubectl("wait", "--for=condition=Established", "--timeout=60s", *CRD_NAMES)
    target.kubectl("apply", "-f", str(REPO / "manifests" / "worker-rbac.yaml"))
    if target.kubectl("get", "namespace", namespace, check=False).returncode != 0:
        target.kubectl("create", "namespace", namespace)
    # Established comes a moment before the new types are served.
    _until(
        lambda: target.kubectl("get", "apportion", "-n", namespace, check=False).returncode == 0,
        30,
        "the apportion CRDs are not served",
    )


# ------------------------------------------------------------------------------ the operator


class Operator:
    """The operator the demo runs: a local process, or (on a real node) the StatefulSet that
    manifests/ installs."""

    def __init__(self, target: Target, process: subprocess.Popen[bytes] | None, log: Path):
        self.target = target
        self.process = process
        self.log = log

    def stopped(self) -> str | None:
        """Why the operator is gone, or None while it runs (on a real node the kubelet restarts
        it, as on any cluster)."""
        if self.process is None or self.process.poll() is None:
            return None
        return f"the operator exited ({self.process.returncode}){self.tail()}"

    def tail(self, lines: int = 30) -> str:
        if self.process is None:
            logs = self.target.kubectl(
                "logs", "-n", OPERATOR_NAMESPACE, OPERATOR, f"--tail={lines}", check=False
            )
            return f"; the operator's last lines:\n{logs.stdout}" if logs.stdout else ""
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return f"; the last lines of {self.log}:\n" + "\n".join(text) if text else ""


@contextlib.contextmanager
def _operator(target: Target, namespace: str) -> Iterator[Operator]:
    log = target.workdir / "operator.log"
    if target.real_node:
        operator = Operator(target, None, log)
        _say("installing the operator from manifests/ (kubectl apply -k, the image built here)")
        target.kubectl("apply", "-k", str(REPO / "manifests"))
        target.kubectl("rollout", "status", "-n", OPERATOR_NAMESPACE, OPERATOR, "--timeout=180s")
        output = None
    else:
        output = log.open("w")
        command = [sys.executable, "-m", "apportion", "operator", "--namespace", namespace]
        _say(f"starting the operator (log: {log})")
        # Its own session: Ctrl-C reaches the demo only, which then stops the operator first.
        process = subprocess.Popen(
            command,
            env=target.env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        operator = Operator(target, process, log)
    samples = [_sample(name).read_text() for name in SAMPLES]
    try:
        _say("applying " + ", ".join(f"manifests/samples/{s}" for s in SAMPLES))
        for sample in samples:
            target.kubectl("apply", "-n", namespace, "-f", "-", input=sample)
        yield operator
    finally:
        if target.local is None:
            # A cluster of the user's keeps nothing of the demo (the operator still runs, so
            # the sets' cleanup happens as it would in production).
            _say("removing the samples")
            for sample in samples:
                target.kubectl(
                    "delete",
                    "-n",
                    namespace,
                    "-f",
                    "-",
                    "--ignore-not-found",
                    "--timeout=60s",
                    input=sample,
                    check=False,
                )
        _say("stopping the operator")
        running = operator.process
        if running is not None and running.poll() is None:
            running.send_signal(signal.SIGTERM)
            try:
                running.wait(timeout=20)
            except subprocess.TimeoutExpired:
                running.kill()
                running.wait()
        if output is not None:
            output.close()


def _wait_balanced(target: Target, namespace: str, operator: Operator, timeout: float) -> None:
    _say("waiting until the sets are Balanced and the grain types Ready")
    deadline = time.monotonic() + timeout
    shown = ""
    while True:
        stopped = operator.stopped()
        if stopped is not None:
            raise DemoError(stopped)
        states = [_set_state(target, namespace, kind, name) for kind, name in SETS]
        line = "; ".join(text for _, text in states)
        if line != shown:
            _say(line)
            shown = line
        if all(done for done, _ in states):
            return
        if time.monotonic() > deadline:
            raise DemoError(f"not Balanced after {timeout:.0f}s: {line}{operator.tail()}")
        time.sleep(1.0)


def _set_state(target: Target, namespace: str, kind: str, name: str) -> tuple[bool, str]:
    found = target.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return False, f"{kind}/{name} not found"
    obj: dict[str, Any] = json.loads(found.stdout)
    status = obj.get("status") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or ()}
    current = status.get("observedGeneration") == obj["metadata"].get("generation")

    def show(type_: str) -> str:
        c = conditions.get(type_)
        if c is None:
            return f"{type_}=?"
        return f"{type_}={c['status']}" + ("" if c["status"] == "True" else f" ({c['reason']})")

    members = status.get("members", 0)
    if kind == "graintype":
        # A GrainType is never "balanced": activations are placed one by one, by its table.
        done = current and conditions.get("Ready", {}).get("status") == "True"
        return done, f"{kind}/{name}: {show('Ready')}, {members} members"
    # Balanced over every replica of the workload, not over the first pods that came up.
    workload = (obj.get("spec") or {}).get("workloadRef") or {}
    replicas = _replicas(target, namespace, workload)
    done = (
        current
        and all(conditions.get(t, {}).get("status") == "True" for t in ("Ready", "Balanced"))
        and (replicas is None or members == replicas)
    )
    of = "" if replicas is None else f" of {replicas}"
    text = f"{kind}/{name}: {show('Ready')} {show('Balanced')}, {members}{of} members"
    return done, text


def _replicas(target: Target, namespace: str, workload: dict[str, Any]) -> int | None:
    if not workload.get("name"):
        return None
    found = target.kubectl(
        "get",
        workload.get("kind", "StatefulSet").lower(),
        workload["name"],
        "-n",
        namespace,
        "-o",
        "jsonpath={.spec.replicas}",
        check=False,
    )
    text = found.stdout.strip()
    return int(text) if found.returncode == 0 and text.isdigit() else None


def _until(condition: Any, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise DemoError(message)
        time.sleep(0.5)


# -------------------------------------------------------------------------- what to try now


def _instructions(target: Target, namespace: str) -> str:
    from apportion.api.assignment import assignment_config_map
    from apportion.api.placement_table import configmap_name

    ns = "" if namespace == "default" else f" -n {namespace}"
    table = assignment_config_map("PartitionSet", "demo")
    placement = configmap_name("cart")
    apportion = _apportion_command()
    patch = "kubectl patch configmap " + TRAFFIC + ns + " --type merge -p '{\"data\": {%s}}'"
    steps: list[tuple[str, str]] = [
        (f"kubectl get apportion{ns}", "the three kinds: Ready, Balanced, members, epoch"),
        (f"kubectl describe partitionset demo{ns}", "conditions, units and load per pod, Events"),
        (
            f"kubectl get configmap {table}{ns} -o jsonpath='{{.data.assignments\\.json}}'",
            "the assignment workers read",
        ),
        (
            f"kubectl get partitionset demo{ns} -o jsonpath='{{.status.memberUnits}}'",
            "partitions and requests per second on each pod, from the traffic",
        ),
        (patch % '"skew": "2"', "hotter keys: Balanced moves partitions off the hot pod"),
        (patch % '"paused": "true"', 'no traffic ("false" to resume)'),
        (f"kubectl scale statefulset {WORKERS}{ns} --replicas=5", "a fifth worker..."),
        (f"kubectl get partitionset demo{ns} -w", "...and the rebalance by load"),
        (
            f"{apportion} locate --scheme netherite --count 32 demo-17 'customer!5'",
            "the partition of an ID",
        ),
        (f"kubectl get graintypes{ns} -o wide", "the grain types: members, table version"),
        (
            f"kubectl get configmap {placement}{ns} -o jsonpath='{{.data.placement\\.json}}'",
            "the placement table the silos place cart grains by",
        ),
        (
            f"{apportion} explain grain cart cart-17{ns}",
            "where a new cart activation would go now, and why",
        ),
    ]
    pod = _pod_ip(target, namespace, f"{WORKERS}-0")
    if pod:
        steps.append((f"curl http://{pod}:8080/key/demo-17", "200 if served here, else 421"))
    if target.real_node:
        steps.append(
            (
                f"kubectl get pods -n {OPERATOR_NAMESPACE} -o wide",
                "the operator pair, real containers on the real node",
            )
        )
        steps.append(
            (
                f"kubectl top pods{ns}",
                "CPU and memory of every worker, from metrics-server",
            )
        )
    elif target.local is not None:
        logs = target.local.pod_log_path(namespace, f"{WORKERS}-0").parent
        steps.append(
            (
                f"sort -m {logs}/{WORKERS}-*.log | grep -E ' (acquire|release|stop) '",
                "every hand-off, in time order",
            )
        )
    lines = ["", "apportion demo is ready. In another shell:", ""]
    lines.append(f"  export KUBECONFIG={target.kubeconfig}")
    if target.kubectl_dir is not None:
        lines.append(f"  export PATH={target.kubectl_dir}:$PATH   # the matching kubectl")
    for command, why in steps:
        lines += ["", f"  # {why}", f"  {command}"]
    where = (
        f"kubectl logs -n {OPERATOR_NAMESPACE} {OPERATOR}"
        if target.real_node
        else target.workdir / "operator.log"
    )
    lines += ["", f"operator log: {where}", ""]
    return "\n".join(lines)


def _apportion_command() -> str:
    beside = Path(sys.executable).parent / "apportion"
    return str(beside) if beside.exists() else f"{sys.executable} -m apportion"


def _pod_ip(target: Target, namespace: str, pod: str) -> str:
    found = target.kubectl(
        "get", "pod", pod, "-n", namespace, "-o", "jsonpath={.status.podIP}", check=False
    )
    return found.stdout.strip() if found.returncode == 0 else ""
