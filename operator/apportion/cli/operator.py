"""`apportion operator`: run the operator (kopf) against the current kubeconfig."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the operator against the current kubeconfig",
        description="Run apportion's kopf handlers for GrainType, PartitionSet and ShardSet "
        "against the cluster of the current kubeconfig (or the in-cluster service account).",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch only this namespace (repeatable; kopf globs like 'team-*' allowed)",
    )
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", help="watch every namespace (default)"
    )
    election = parser.add_mutually_exclusive_group()
    election.add_argument(
        "--leader-election",
        metavar="NAME",
        help="run with other replicas: the one holding the coordination.k8s.io Lease NAME "
        "places units, the others stand by (client-go's leader election)",
    )
    election.add_argument(
        "--standalone", action="store_true", help="run without leader election (default)"
    )
    parser.add_argument(
        "--leader-election-namespace",
        metavar="NS",
        help="namespace of the Lease (default: $POD_NAMESPACE, else the service account's)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve the operator's Prometheus metrics at /metrics, e.g. 0.0.0.0:8081 "
        "(docs/operations.md)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    try:
        import kopf  # noqa: F401
    except ImportError:
        print(
            "apportion operator: kopf is not installed: pip install 'apportion[operator]'",
            file=sys.stderr,
        )
        return 2
    if args.leader_election and not lease_namespace(args):
        args.parser.error(
            "--leader-election needs --leader-election-namespace (or $POD_NAMESPACE) outside a pod"
        )
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2"):  # one INFO line per API request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(_operate(args))
    return 0


async def _operate(args: argparse.Namespace) -> None:
    import asyncio
    import os

    import kopf

    from apportion.controllers import load_handlers, telemetry
    from apportion.controllers.heap import freeze_long_lived
    from apportion.controllers.leadership import LeaderElection
    from apportion.controllers.runtime import Runtime
    from apportion.controllers.settings import build_settings

    load_handlers()
    if args.metrics:
        telemetry.serve(args.metrics)
    namespaces = args.namespaces or []
    runtime = Runtime.create(namespaces)
    if args.leader_election:
        identity = os.environ.get("POD_NAME") or f"{os.uname().nodename}-{os.getpid()}"
        election = LeaderElection(
            runtime.client, args.leader_election, lease_namespace(args), identity
        )
        leading = asyncio.ensure_future(election.run(runtime.lead))
    else:
        leading = asyncio.ensure_future(runtime.lead())
    freezing = asyncio.ensure_future(freeze_long_lived())
    try:
        # kopf runs the watches and the handlers that feed the runtime; every replica keeps
        # its view warm, only the leader runs loops (`Runtime.lead`).
        await kopf.operator(
            settings=build_settings(),
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=True,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(runtime=runtime),
        )
    finally:
        leading.cancel()
        freezing.cancel()
        await asyncio.gather(leading, freezing, return_exceptions=True)
        await runtime.close()


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def lease_namespace(args: argparse.Namespace) -> str:
    import os

    if args.leader_election_namespace:
        return str(args.leader_election_namespace)
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as file:
            return file.read().strip()
    except OSError:
        return ""
