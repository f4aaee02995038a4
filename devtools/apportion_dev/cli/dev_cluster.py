"""`apportion dev-cluster`: a real Kubernetes control plane on loopback, built from Go modules.

build       build etcd, kube-apiserver, kube-controller-manager, kubectl and the node binaries
            (kubelet, kube-scheduler, kube-proxy) once per version
image       build apportion's container image from the Dockerfile with buildah (`make image`)
start       start a cluster that keeps running after the command returns; `--node real` runs a
            real node (kubelet + containerd, root on Linux) instead of the pod simulator,
            `--node real --nodes N` N of them, each in a network namespace and zone of its own;
            `--registry` an OCI registry the real nodes pull `ghcr.io/...` names from,
            `--dist DIR` (implies --registry) a release's images and charts pushed into it and
            its Python distributions and Maven repository served as an index and a repository
registry    print the registries' addresses as shell assignments (`eval $(...)`)
publish DIR push a release's images (DIR/images/*.oci.tar) and charts (DIR/charts/*.tgz) into
            the running cluster's registry
tools       build the Go tools the tests run (promtool, helm, krew, kstatus, Flux, Argo CD) once
            per version; `tools NAME...` builds just those (also the real node's containerd and
            metrics-server)
stop        stop it and delete its state
status      show whether it runs and where its kubeconfig is
kubeconfig  print the kubeconfig path (`export KUBECONFIG=$(apportion dev-cluster kubeconfig)`)
run -- CMD  start a private cluster, run CMD against it, stop it, exit with CMD's status
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apportion_dev.devcluster import DevCluster


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dev-cluster",
        help="local kube-apiserver + controller-manager + etcd + pod simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("build", help="build the control-plane binaries if they are not cached")
    actions.add_parser("image", help="build apportion's image with buildah")
    tools_parser = actions.add_parser(
        "tools",
        help="build the test tools (promtool, helm, krew, kstatus, Flux, Argo CD) if not cached",
    )
    tools_parser.add_argument(
        "names", nargs="*", metavar="NAME", help="build only these, in this order"
    )
    state_dir_help = (
        "state directory (default: $APPORTION_DEV_CLUSTER_DIR or ~/.local/state/apportion/"
        "dev-cluster)"
    )
    for name, help_text in (
        ("start", "start a cluster in the background"),
        ("stop", "stop the cluster and remove its state"),
        ("status", "show the cluster's processes"),
        ("kubeconfig", "print the kubeconfig path"),
        ("registry", "print the registries' addresses"),
        ("publish", "push a release's images and charts into the registry"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--state-dir", type=Path, default=None, help=state_dir_help)
        if name == "start":
            action.add_argument(
                "--no-pod-simulator",
                dest="pod_simulator",
                action="store_false",
                help="leave Pods Pending (no simulated nodes)",
            )
            action.add_argument(
                "--node",
                choices=("sim", "real", "auto"),
                default="sim",
                help="sim: the pod simulator (default); real: a kubelet with containerd running "
                "real containers (Linux, root; one per machine); auto: real where the machine "
                "allows it, else sim",
            )
            action.add_argument(
                "--nodes",
                type=int,
                default=1,
                help="how many real nodes (with --node real; up to 4), each with its own "
                "containerd, kubelet, kube-proxy, network namespace, pod CIDR and zone",
            )
            action.add_argument(
                "--registry",
                action="store_true",
                help="run an OCI registry (CNCF Distribution); real nodes pull ghcr.io/... "
                "names from it",
            )
            action.add_argument(
                "--dist",
                type=Path,
                default=None,
                metavar="DIR",
                help="a release directory (make release's dist/): push its images and charts "
                "into the registry (implies --registry), serve its python/ as a package index "
                "and its maven/ as a Maven repository",
            )
        if name == "publish":
            action.add_argument("dist", type=Path, metavar="DIR", help="a release directory")
    run_parser = actions.add_parser("run", help="start a private cluster, run CMD, stop")
    run_parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from apportion_dev.devcluster import DevCluster, DevClusterError, ensure_built
    from apportion_dev.devcluster.state import default_state_dir

    try:
        if args.action == "build":
            print(ensure_built())
            return 0
        if args.action == "image":
            from apportion_dev.devcluster.realnode import images

            images.build_image()
            return 0
        if args.action == "tools":
            from apportion_dev.devcluster.tools import ALL_TOOLS, TEST_TOOLS, ensure_tool

            unknown = [name for name in args.names if name not in ALL_TOOLS]
            if unknown:
                raise DevClusterError(
                    f"no tool named {', '.join(unknown)}; the tools are {', '.join(ALL_TOOLS)}"
                )
            for tool in [ALL_TOOLS[name] for name in args.names] or TEST_TOOLS:
                print(ensure_tool(tool))
            return 0
        if args.action == "run":
            return _run_command(args.command)
        state_dir = args.state_dir or default_state_dir()
        if args.action == "start":
            real_node = choose_real_node(args.node)
            return _start(
                state_dir,
                args.state_dir is not None,
                DevClusterOptions(
                    args.pod_simulator, real_node, args.nodes, args.registry, args.dist
                ),
            )
        if args.action == "stop":
            return _stop(state_dir)
        return _attached(DevCluster.attach(state_dir), args)
    except DevClusterError as error:
        print(f"apportion dev-cluster {args.action}: {error}", file=sys.stderr)
        return 1


def _attached(cluster: DevCluster, args: argparse.Namespace) -> int:
    """The actions on a cluster that exists: kubeconfig, status, registry, publish."""
    if args.action == "kubeconfig":
        print(cluster.kubeconfig)
    elif args.action == "status":
        for name, alive in cluster.process_status().items():
            print(f"{name:<24} {'running' if alive else 'NOT RUNNING'}")
        print(f"{'server':<24} {cluster.server}")
        print(f"{'kubeconfig':<24} {cluster.kubeconfig}")
        return 0 if cluster.running() else 1
    elif args.action == "registry":
        print(registry_lines(cluster), end="")
    elif args.action == "publish":
        from apportion_dev.devcluster import DevClusterError, registry

        if cluster.registry is None:
            raise DevClusterError(NO_REGISTRY)
        for pushed in registry.publish(args.dist, cluster.registry):
            print(pushed)
    return 0


def choose_real_node(node: str) -> bool:
    """`--node auto` runs a real node where the machine allows it and says in one line why not
    otherwise."""
    if node == "sim":
        return False
    from apportion_dev.devcluster.realnode.host import why_not

    reason = why_not()
    if node == "auto" and reason:
        print(f"pod simulator instead of a real node: {reason}", file=sys.stderr)
    return node == "real" or reason is None


def _stop(state_dir: Path) -> int:
    """Stop the cluster in `state_dir`, and put the machine back as it was if a real node was
    left behind by a cluster that is gone (its starting process was SIGKILLed)."""
    from apportion_dev.devcluster import DevCluster, DevClusterError
    from apportion_dev.devcluster.cluster import clean_up_abandoned_node

    try:
        DevCluster.attach(state_dir).stop()
        print(f"stopped; removed {state_dir}")
        stopped = True
    except DevClusterError as error:
        stopped = False
        message = str(error)
    abandoned = clean_up_abandoned_node()
    if abandoned:
        print(f"cleaned up the real node abandoned by {abandoned}")
    if not (stopped or abandoned):
        print(f"apportion dev-cluster stop: {message}", file=sys.stderr)
        return 1
    return 0


NO_REGISTRY = "this dev-cluster runs no registry: start it with --registry"


@dataclass(frozen=True)
class DevClusterOptions:
    pod_simulator: bool
    real_node: bool
    nodes: int
    registry: bool
    dist: Path | None


def registry_lines(cluster: DevCluster) -> str:
    """The registries' addresses as shell assignments; a README line can `eval` them."""
    from apportion_dev.devcluster import DevClusterError

    found = {
        "APPORTION_REGISTRY": cluster.registry,
        "APPORTION_PYTHON_INDEX": cluster.python_index,
        "APPORTION_MAVEN_REPOSITORY": cluster.maven_repository,
    }
    if not any(found.values()):
        raise DevClusterError(NO_REGISTRY)
    return "".join(f"{key}={value}\n" for key, value in found.items() if value)


def _start(state_dir: Path, explicit_dir: bool, options: DevClusterOptions) -> int:
    from apportion_dev.devcluster import DevCluster, DevClusterError

    try:
        existing = DevCluster.attach(state_dir)
    except DevClusterError:
        existing = None
    if existing is not None and existing.running():
        print(f"already running: export KUBECONFIG={existing.kubeconfig}")
        return 0
    began = time.monotonic()
    cluster = DevCluster.start(
        state_dir,
        pod_simulator=options.pod_simulator,
        real_node=options.real_node,
        nodes=options.nodes,
        registry=options.registry,
        dist=options.dist,
        detach=True,
    )
    stop = "apportion dev-cluster stop" + (f" --state-dir {state_dir}" if explicit_dir else "")
    print(
        f"dev-cluster ready in {time.monotonic() - began:.1f}s at {cluster.server}\n"
        f"  export KUBECONFIG={cluster.kubeconfig}\n"
        f"  export PATH={cluster.bin_dir}:$PATH   # the matching kubectl\n"
        f"  logs: {cluster.state_dir / 'logs'}\n"
        f"stop it with: {stop}"
    )
    if cluster.registry is not None:
        print("registries (`apportion dev-cluster registry`):\n" + registry_lines(cluster), end="")
    return 0


def _run_command(command: list[str]) -> int:
    import signal
    import subprocess

    from apportion_dev.devcluster import DevCluster

    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("apportion dev-cluster run: give a command after --", file=sys.stderr)
        return 2
    # SIGTERM (CI cancelling a job) unwinds like Ctrl-C, so the cluster is stopped and removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with DevCluster.start() as cluster:
        try:
            return subprocess.run(command, env=cluster.env, check=False).returncode
        except FileNotFoundError:
            print(f"apportion dev-cluster run: {command[0]}: command not found", file=sys.stderr)
            return 127
