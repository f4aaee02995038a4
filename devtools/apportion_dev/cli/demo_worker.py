"""`apportion demo-worker`: the demo worker the samples run (docs/worker.md).

Unit mode (a PartitionSet or ShardSet):
    apportion demo-worker --kind PartitionSet --set demo [--port 8080] [--load-profile uniform]
serves GET/POST /key/<id>, /units, /counters, /metrics and /healthz on $POD_IP (else every
address), counts increments per key (handed over with the units), and logs every
acquire/release/stop/split/merge with its epoch. SIGTERM drains: the units move away, then it
exits. With --postgres (or $APPORTION_DEMO_POSTGRES) each request by key is a fenced write
(apportion.fencing, the `postgres` extra) under the unit's token; a refused one answers 409.

Grain mode (GrainTypes):
    apportion demo-worker --grains [TYPE ...] [--rate R] [--lifetime S] [--port 8080]
places activations through the namespace's placement tables (apportion_dev.grains.grain_app).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apportion_dev.worker.unit_app import LoadProfile


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo-worker",
        help="the demo worker the samples run (needs POD_NAME, POD_NAMESPACE)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    units = parser.add_argument_group("unit mode")
    units.add_argument("--kind", choices=("PartitionSet", "ShardSet"), help="the set's kind")
    units.add_argument("--set", dest="set_name", metavar="NAME", help="the set's name")
    units.add_argument(
        "--load-profile",
        default="uniform",
        metavar="PROFILE",
        help="per-unit load reported on /metrics: uniform[:V] (default, V=1), zipf[:S] "
        "(unit u: 100/(u+1)^S), units:U=V,...[,*=DEFAULT], requests (GET/POST /key per second), "
        "none",
    )
    units.add_argument(
        "--release-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="time a release takes after the unit's requests finished (default 0)",
    )
    units.add_argument(
        "--work-time",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="time each GET/POST /key request takes (default 0)",
    )
    units.add_argument(
        "--burn-cpu",
        type=float,
        default=0.0,
        metavar="MILLICORES",
        help="spend real CPU on every unit held, MILLICORES x its profile load, and report the "
        "CPU each unit got as its load (default 0: report the profile's figures)",
    )
    units.add_argument(
        "--postgres",
        default=os.environ.get("APPORTION_DEMO_POSTGRES") or None,
        metavar="CONNINFO",
        help="write each request by key to PostgreSQL (libpq conninfo) through a fenced write "
        "under the unit's token, answering 409 when the fence refuses it (default "
        "$APPORTION_DEMO_POSTGRES, which keeps a password off the command line; unset: no "
        "writes)",
    )
    grains = parser.add_argument_group("grain mode")
    grains.add_argument(
        "--grains",
        nargs="*",
        metavar="TYPE",
        help="run the grain demo; with grain types and --rate, activate grains continuously",
    )
    grains.add_argument("--rate", type=float, default=0.0, help="activations per second")
    grains.add_argument("--lifetime", type=float, default=0.0, help="seconds per activation")
    parser.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    parser.add_argument("--host", help="address to listen on (default $POD_IP, else all)")
    parser.add_argument(
        "--namespace", help="namespace of the set (default $POD_NAMESPACE, else the kubeconfig's)"
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    parser.set_defaults(func=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    if args.grains is not None:
        if args.kind or args.set_name:
            parser.error("--grains runs the grain demo: leave out --kind and --set")
        main = _grain_mode(args)
    else:
        if not (args.kind and args.set_name):
            parser.error("--kind and --set are required (or --grains for the grain demo)")
        if args.release_delay < 0 or args.work_time < 0 or args.burn_cpu < 0:
            parser.error("--release-delay, --work-time and --burn-cpu must be >= 0")
        from apportion_dev.worker.unit_app import LoadProfile

        try:
            profile = LoadProfile.parse(args.load_profile)
        except ValueError as error:
            parser.error(f"--load-profile: {error}")
        main = _unit_mode(args, profile)
    _configure_logging(args.verbose)
    import asyncio

    from apportion.worker import WorkerError

    try:
        asyncio.run(main)
    except WorkerError as error:
        print(f"apportion demo-worker: {error}", flush=True)
        return 1
    return 0


async def _unit_mode(args: argparse.Namespace, profile: LoadProfile) -> None:
    from apportion_dev.worker.unit_app import Behaviour, DemoWorker

    demo = DemoWorker(
        args.kind,
        args.set_name,
        port=args.port,
        host=args.host,
        namespace=args.namespace,
        behaviour=Behaviour(
            profile=profile,
            release_delay=args.release_delay,
            work_time=args.work_time,
            burn_millicores=args.burn_cpu,
        ),
        postgres=args.postgres,
    )
    await demo.run()


async def _grain_mode(args: argparse.Namespace) -> None:
    from apportion.cli.signals import until_signalled
    from apportion.worker import WorkerError
    from apportion_dev.grains.grain_app import serve

    member = os.environ.get("POD_NAME")
    if not member:
        raise WorkerError("POD_NAME is not set (give it through the downward API)")
    await until_signalled(
        serve(
            member=member,
            host=args.host or os.environ.get("POD_IP") or "0.0.0.0",
            port=args.port,
            namespace=args.namespace or os.environ.get("POD_NAMESPACE"),
            grain_types=args.grains,
            rate=args.rate,
            lifetime=args.lifetime,
        )
    )


def _configure_logging(verbose: bool) -> None:
    import logging
    import sys

    from apportion_dev.worker.unit_app import OWNERSHIP_LOGGER

    # Every line starts with Unix time, so lines of several workers sort into one timeline.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(created).6f %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for noisy in ("httpx", "httpx2", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    plain = logging.StreamHandler(sys.stdout)
    plain.setFormatter(logging.Formatter("%(created).6f %(message)s"))
    ownership = logging.getLogger(OWNERSHIP_LOGGER)
    ownership.addHandler(plain)
    ownership.propagate = False
