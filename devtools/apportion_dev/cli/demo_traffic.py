"""`apportion demo-traffic`: the demo's load generator (apportion_dev.worker.traffic).

    apportion demo-traffic --set PartitionSet/demo --set ShardSet/carts \\
        --grain-type cart --grain-silos app=grain-silos [--config demo-traffic]

Sends requests for Zipf-skewed keys to the sets' workers, routed by their published tables,
and asks the silos for grain activations. Steer it with the ConfigMap (data keys: rate, skew,
keys, grainRate, grainLifetime, paused), e.g.

    kubectl patch configmap demo-traffic --type merge -p '{"data": {"skew": "2"}}'
"""

from __future__ import annotations

import argparse
import os

KINDS = ("PartitionSet", "ShardSet")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo-traffic",
        help="the demo's load generator: Zipf-skewed requests to the samples' workers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        type=_unit_set,
        metavar="KIND/NAME",
        help="a PartitionSet or ShardSet whose workers get requests (repeatable)",
    )
    parser.add_argument(
        "--grain-type",
        dest="grain_types",
        action="append",
        default=[],
        metavar="TYPE",
        help="a grain type to activate grains of (repeatable)",
    )
    parser.add_argument(
        "--grain-silos", metavar="SELECTOR", help="label selector of the silos, e.g. app=silos"
    )
    parser.add_argument(
        "--config", default="demo-traffic", metavar="NAME", help="the steering ConfigMap"
    )
    parser.add_argument(
        "--namespace", help="namespace (default $POD_NAMESPACE, else the kubeconfig's)"
    )
    parser.add_argument("--seed", type=int, help="seed of the key draws (default: random)")
    parser.set_defaults(func=run, parser=parser)


def _unit_set(text: str) -> tuple[str, str]:
    kind, _, name = text.partition("/")
    if kind not in KINDS or not name:
        raise argparse.ArgumentTypeError(f"expected PartitionSet/NAME or ShardSet/NAME: {text!r}")
    return kind, name


def run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    if not args.sets and not args.grain_types:
        parser.error("nothing to send traffic to: give --set and/or --grain-type")
    if args.grain_types and not args.grain_silos:
        parser.error("--grain-type needs --grain-silos (the silos' label selector)")
    import asyncio
    import logging
    import sys

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(created).6f %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(_main(args))
    return 0


async def _main(args: argparse.Namespace) -> None:
    from lightkube import AsyncClient

    from apportion.cli.signals import until_signalled
    from apportion_dev.worker.traffic import Traffic

    client = AsyncClient()
    traffic = Traffic(
        client,
        args.namespace or os.environ.get("POD_NAMESPACE") or client.namespace,
        unit_sets=args.sets,
        grain_types=args.grain_types,
        grain_silos=args.grain_silos,
        config_map=args.config,
        seed=args.seed,
    )
    try:
        await until_signalled(traffic.run())
    finally:
        await client.close()
