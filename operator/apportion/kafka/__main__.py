"""`python -m apportion.kafka`: a demo consumer of one topic on a PartitionSet, for tests and
benchmarks. It logs each record it handles, after the ownership and commit lines of
`apportion.kafka`, one line each, Unix time first:

    1718000000.123456 processed unit=3 offset=57 key=k7 value=k7:12 pod=c-0

`--work-time` seconds are spent on each record (a stand-in for real work)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from apportion.kafka._consumer import PartitionConsumer
from apportion.worker import WorkerError, WorkerOptions

processed = logging.getLogger("apportion.kafka.processed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m apportion.kafka", description=__doc__)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--set", dest="set_name", required=True, help="PartitionSet name")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--group", required=True, help="group id the offsets are committed under")
    parser.add_argument("--work-time", type=float, default=0.0)
    parser.add_argument("--commit-interval", type=float, default=1.0)
    parser.add_argument("--port", type=int, default=None, help="serve /metrics here")
    args = parser.parse_args(argv)

    plain = logging.StreamHandler(sys.stdout)
    plain.setFormatter(logging.Formatter("%(created).6f %(message)s"))
    logging.basicConfig(
        level=logging.INFO, handlers=[plain], format="%(created).6f %(levelname)s %(message)s"
    )
    for noisy in ("httpx", "httpx2", "aiokafka", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        asyncio.run(_run(args))
    except WorkerError as error:
        print(f"python -m apportion.kafka: {error}", flush=True)
        return 1
    return 0


async def _run(args: argparse.Namespace) -> None:
    pod = os.environ.get("POD_NAME", "-")

    async def handle(record) -> None:  # type: ignore[no-untyped-def]
        if args.work_time:
            await asyncio.sleep(args.work_time)
        processed.info(
            "processed unit=%d offset=%d key=%s value=%s pod=%s",
            record.partition,
            record.offset,
            (record.key or b"").decode(),
            (record.value or b"").decode(),
            pod,
        )

    async with PartitionConsumer(
        args.topic,
        handle,
        set_name=args.set_name,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        commit_interval=args.commit_interval,
        worker_options={"options": WorkerOptions(port=args.port)},
    ) as consumer:
        await consumer.worker.wait_drained()


if __name__ == "__main__":
    sys.exit(main())
