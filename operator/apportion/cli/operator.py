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
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering",
        metavar="NAME",
        help="coordinate with other replicas through the kopf peering object NAME (created if "
        "missing); only the highest --priority runs",
    )
    peering.add_argument("--standalone", action="store_true", help="run without peering (default)")
    parser.add_argument(
        "--priority", type=int, help="peering priority; replicas need distinct values"
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
    if args.priority is not None and not args.peering:
        args.parser.error("--priority needs --peering NAME")
    if args.peering and any(ch in ns for ns in args.namespaces or () for ch in "*?[!"):
        args.parser.error("--peering needs exact --namespace names, not patterns")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2"):  # one INFO line per API request
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(_operate(args))
    return 0


async def _operate(args: argparse.Namespace) -> None:
    import kopf

    from apportion.controllers import load_handlers, telemetry
    from apportion.controllers.peering import ensure_peering
    from apportion.controllers.runtime import Runtime
    from apportion.controllers.settings import build_settings

    load_handlers()
    if args.metrics:
        telemetry.follow_peering(standalone=not args.peering)
        telemetry.serve(args.metrics)
    namespaces = args.namespaces or []
    if args.peering:
        await ensure_peering(args.peering, namespaces)
    runtime = Runtime.create(namespaces)
    try:
        await kopf.operator(
            settings=build_settings(),
            clusterwide=not namespaces,
            namespaces=namespaces,
            standalone=not args.peering,
            peering_name=args.peering,
            priority=args.priority,
            liveness_endpoint=args.liveness,
            memo=kopf.Memo(runtime=runtime),
        )
    finally:
        await runtime.close()
