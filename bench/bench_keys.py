"""Key lookup cost per scheme: ns per key, one key at a time and batched (figures, not asserts).

Targets for the default scheme (apportion): <= 150 ns single, <= 10 ns batched.

- single: ``scheme.unit(key, n)`` called once per key (includes Python's call overhead).
- batched: ``scheme.units(keys, n)`` on a list of str.
- for apportion also: the same hash + shift written inline (no function call: what any
  per-key Python API costs at least), batched from pre-encoded bytes, and from pre-computed
  64-bit hashes (``multiply_shift`` alone), which is what a caller with hashed keys pays.

Run: .venv/bin/python bench/bench_keys.py [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import xxhash

from apportion.engine.keys import SCHEMES, KeyScheme, multiply_shift, xxh3_hashes


def per_key(repeat: int, n: int, fn: Callable[..., object], *args: object) -> float:
    """Best wall time of ``fn(*args)`` over ``repeat`` runs, in ns per key."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - start)
    return best / n * 1e9


def one_by_one(scheme: KeyScheme, keys: list[str], count: int) -> list[int]:
    unit = scheme.unit
    return [unit(k, count) for k in keys]


def inline(keys: list[str], count: int) -> list[int]:
    """The interpreter's floor for one key at a time: hash and shift, no function call."""
    xxh3 = xxhash.xxh3_64_intdigest
    return [(xxh3(k.encode()) * count) >> 64 for k in keys]


def from_bytes(encoded: list[bytes], count: int) -> np.ndarray:
    hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, encoded), np.uint64, len(encoded))
    return multiply_shift(hashes, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer keys and repeats")
    args = parser.parse_args()
    n = 20_000 if args.quick else 200_000
    repeat = 3 if args.quick else 5
    count = 1000
    key_sets = {
        "uuid-like (36 B)": [f"{i:08x}-7b0a-4145-a33e-{i * 7919:012x}" for i in range(n)],
        "short (~10 B)": [f"order-{i}" for i in range(n)],
    }
    print(f"{n} keys per run, count={count}, best of {repeat}; ns per key")
    print(f"{'scheme':<11} {'keys':<17} {'single':>8} {'batched':>8}")
    for label, keys in key_sets.items():
        for name, scheme in SCHEMES.items():
            single = per_key(repeat, n, one_by_one, scheme, keys, count)
            batched = per_key(repeat, n, scheme.units, keys, count)
            print(f"{name:<11} {label:<17} {single:8.0f} {batched:8.1f}")
        print(
            f"{'apportion':<11} {label:<17} {per_key(repeat, n, inline, keys, count):8.0f}", end=""
        )
        print(f" {'':>8}  (inline hash+shift, no call: the interpreter's floor)")
        encoded = [k.encode() for k in keys]
        hashes = xxh3_hashes(keys)
        print(f"{'apportion':<11} {label:<17} {'bytes in':>8} ", end="")
        print(f"{per_key(repeat, n, from_bytes, encoded, count):8.1f}")
        print(f"{'apportion':<11} {label:<17} {'hash in':>8} ", end="")
        print(f"{per_key(repeat, n, multiply_shift, hashes, count):8.1f}")


if __name__ == "__main__":
    main()
