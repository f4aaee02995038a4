"""Assignment ConfigMap size and codec cost (figures, not asserts).

Bytes of the ConfigMaps `encode_assignment` writes for tables of 1k, 10k and 100k units, per
placement shape: contiguous ranges, round-robin (LeastShards' first allocation), churned (ranges
after 30 rounds of rebalancing moves) and random (ConsistentHashing: every unit's owner is
independent, the worst case for compression). Unit epochs follow the moves; 1 % of the units
are mid hand-off. "stored" is what the API server counts against its 1 MiB limit (data plus
decoded binaryData), "wire" the JSON form (binaryData in base64). Goals: <= 64 KiB at 10k
units, <= 256 KiB at 100k. Also the cost of one hand-off `step` over the whole table.

Run: .venv/bin/python -m bench.bench_assignment_size [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

from apportion.api.assignment import (
    AssignmentTable,
    Incarnation,
    Release,
    ResourceRef,
    UnitState,
    decode_assignment,
    encode_assignment,
)
from apportion.api.pods import WorkerPod
from apportion.engine.handoff import step

SET = ResourceRef("ShardSet", "default", "bench", "0f5e7c1a-3b2d-4e6f-8a9b-c0d1e2f3a4b5")
KIB = 1024
NOW = 1_718_000_001.0
GOALS = {10_000: 64 * KIB, 100_000: 256 * KIB}


def shape_ranges(units: int, members: int, rnd: random.Random) -> tuple[list[int], list[int]]:
    return [u * members // units for u in range(units)], [1] * units


def shape_round_robin(units: int, members: int, rnd: random.Random) -> tuple[list[int], list[int]]:
    return [u % members for u in range(units)], [1] * units


def shape_churned(units: int, members: int, rnd: random.Random) -> tuple[list[int], list[int]]:
    owners, epochs = shape_ranges(units, members, rnd)
    for epoch in range(2, 32):  # 30 rebalance rounds, each moving up to 1 % of the units
        for unit in rnd.sample(range(units), max(1, units // 100)):
            owners[unit], epochs[unit] = rnd.randrange(members), epoch
    return owners, epochs


def shape_random(units: int, members: int, rnd: random.Random) -> tuple[list[int], list[int]]:
    # Membership changed a few times: each unit keeps the epoch of its last move.
    return [rnd.randrange(members) for _ in range(units)], [
        rnd.choice((1, 1, 1, 1, 5, 9, 14, 22)) for _ in range(units)
    ]


SHAPES: dict[str, Callable[[int, int, random.Random], tuple[list[int], list[int]]]] = {
    "ranges": shape_ranges,
    "round-robin": shape_round_robin,
    "churned": shape_churned,
    "random": shape_random,
}


def make_table(units: int, members: int, shape: str, seed: int = 7) -> AssignmentTable:
    rnd = random.Random(seed)
    names = [f"bench-workers-{i}" for i in range(members)]
    uids = [f"{rnd.getrandbits(128):032x}" for _ in names]
    owners, epochs = SHAPES[shape](units, members, rnd)
    epoch = max(epochs) + 1
    states = {}
    for unit, (owner, unit_epoch) in enumerate(zip(owners, epochs, strict=True)):
        release = None
        if unit % 100 == 0 and members > 1:
            release = Release(names[(owner + 1) % members], 1_718_000_000.25, epoch)
        states[str(unit)] = UnitState(names[owner], unit_epoch, release)
    return AssignmentTable(
        SET,
        generation=3,
        key_scheme="akka",
        count=units,
        epoch=epoch,
        members=tuple(Incarnation(n, u) for n, u in zip(names, uids, strict=True)),
        units=states,
    )


def timed(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one timing run per case")
    args = parser.parse_args()
    repeat = 1 if args.quick else 3
    cases = [(1_000, 10), (10_000, 50), (10_000, 200), (100_000, 200), (100_000, 1_000)]

    header = (
        f"{'units':>7} {'members':>7} {'shape':<12} {'cms':>3} {'stored KiB':>10} "
        f"{'wire KiB':>8} {'largest':>8} {'encode ms':>9} {'decode ms':>9}  goal"
    )
    print(header)
    print("-" * len(header))
    for units, members in cases:
        for shape in SHAPES:
            table = make_table(units, members, shape)
            payloads = encode_assignment(table)
            stored = sum(p.size for p in payloads)
            wire = sum(p.wire_size for p in payloads)
            goal = GOALS.get(units)
            verdict = (
                ""
                if goal is None
                else ("ok" if stored <= goal else "OVER")
                + (f" (wire {'ok' if wire <= goal else 'over'})")
            )
            enc = timed(partial(encode_assignment, table), repeat)
            dec = timed(partial(decode_assignment, payloads), repeat)
            print(
                f"{units:>7} {members:>7} {shape:<12} {len(payloads):>3} {stored / KIB:>10.1f} "
                f"{wire / KIB:>8.1f} {max(p.size for p in payloads) / KIB:>8.1f} "
                f"{enc:>9.1f} {dec:>9.1f}  {verdict}"
            )

    print("\nhand-off step over the whole table (churned shape)")
    print(f"{'units':>7} {'members':>7} {'no change ms':>12} {'1 % moved ms':>12}")
    for units, members in [(10_000, 50), (100_000, 200)]:
        table = make_table(units, members, "churned")
        live = {m.name: WorkerPod(m.name, m.uid) for m in table.members}
        owners = table.owners()
        target = {u: o for u, o in owners.items() if o is not None}
        moved = dict(target)
        for unit in list(moved)[1::100]:
            moved[unit] = table.members[0].name
        still = timed(partial(step, table, target, {}, live, NOW, 60.0), repeat)
        moving = timed(partial(step, table, moved, {}, live, NOW, 60.0), repeat)
        print(f"{units:>7} {members:>7} {still:>12.1f} {moving:>12.1f}")


if __name__ == "__main__":
    main()
