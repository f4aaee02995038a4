"""`python -m apportion_dev.devcluster.podsim`: run the pod simulator until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from lightkube import AsyncClient, KubeConfig

from apportion_dev.devcluster.podsim.ipam import IpPool, random_prefix
from apportion_dev.devcluster.podsim.nodes import SimulatedNodes
from apportion_dev.devcluster.podsim.simulator import PodSimulator


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m apportion_dev.devcluster.podsim")
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), required=False)
    parser.add_argument("--state-dir", type=Path, required=True, help="pod logs go to DIR/pods/")
    parser.add_argument("--nodes", type=int, default=3, help="simulated nodes (zones a, b, c)")
    parser.add_argument("--ip-prefix", default=None, help="pods get 127.P.x.y for P in 127.P")
    parser.add_argument("--kubelet-version", default="v0.0.0-sim")
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error("--kubeconfig (or KUBECONFIG) is required")
    args.kubeconfig = str(Path(args.kubeconfig).resolve())
    return args


async def serve(args: argparse.Namespace) -> None:
    kubeconfig = args.kubeconfig
    client = AsyncClient(
        KubeConfig.from_file(kubeconfig), field_manager="apportion-podsim", trust_env=False
    )
    pool = IpPool(args.ip_prefix or random_prefix())
    nodes = SimulatedNodes(client, pool, args.nodes, args.kubelet_version)
    simulator = PodSimulator(
        client,
        nodes=nodes,
        pool=pool,
        state_dir=args.state_dir.resolve(),
        kubeconfig=kubeconfig,
        # The interpreter's bin directory first, so `apportion …` commands resolve to this install.
        path_prefix=str(Path(sys.executable).parent),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    running = asyncio.create_task(simulator.run())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([running, stopping], return_when=asyncio.FIRST_COMPLETED)
    running.cancel()
    stopping.cancel()
    try:
        await running
    except asyncio.CancelledError:
        pass
    finally:
        await simulator.shutdown()
        await client.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # one line per request drowns the rest
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
