"""Key lookup cost per scheme: ns per key, one key at a time and batched (figures, not asserts).

Targets for the default scheme (apportion): <= 150 ns single, <= 10 ns batched.

Each scheme runs on the path ``SCHEMES`` uses — the C kernel ``apportion.engine._keys`` when it
is built (``keys.NATIVE``), which the first line says — and, for comparison, on the Python path
(``PURE_SCHEMES``), which is what an install without a compiler or libxxhash-dev gets.

- single: ``scheme.unit(key, n)`` called once per key (includes Python's call overhead).
- batched: ``scheme.units(keys, n)`` on a list of str.
- for apportion on the Python path also: the same hash + shift written inline (no function
  call: what any per-key Python API costs at least), batched from pre-encoded bytes, and from
  pre-computed 64-bit hashes (``multiply_shift`` alone), what a caller with hashed keys pays.

Run: .venv/bin/python -m bench.bench_keys [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import xxhash

from apportion.engine import keys
from apportion.engine.keys import PURE_SCHEMES, SCHEMES, KeyScheme, multiply_shift, xxh3_hashes


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
    if keys.NATIVE:
        from apportion.engine import _keys

        version = _keys.XXHASH_VERSION
        lib = f"{version // 10000}.{version // 100 % 100}.{version % 100}"
        print(f"path: native C kernel (apportion.engine._keys, libxxhash {lib})")
    else:
        print("path: Python (C kernel not built: no compiler or libxxhash-dev at install)")
    print(f"{n} keys per run, count={count}, best of {repeat}; ns per key")
    print(f"{'scheme':<11} {'path':<7} {'keys':<17} {'single':>8} {'batched':>8}")
    paths = {"python": PURE_SCHEMES}
    if keys.NATIVE:
        paths = {"native": SCHEMES, **paths}
    for label, key_set in key_sets.items():
        for path, schemes in paths.items():
            for name, scheme in schemes.items():
                single = per_key(repeat, n, one_by_one, scheme, key_set, count)
                batched = per_key(repeat, n, scheme.units, key_set, count)
                print(f"{name:<11} {path:<7} {label:<17} {single:8.0f} {batched:8.1f}")
        row = f"{'apportion':<11} {'python':<7} {label:<17}"
        print(f"{row} {per_key(repeat, n, inline, key_set, count):8.0f}", end="")
        print(f" {'':>8}  (inline hash+shift, no call: the interpreter's floor)")
        encoded = [k.encode() for k in key_set]
        hashes = xxh3_hashes(key_set)
        print(f"{row} {'':>8} {per_key(repeat, n, from_bytes, encoded, count):8.1f}  (bytes in)")
        print(f"{row} {'':>8} {per_key(repeat, n, multiply_shift, hashes, count):8.1f}  (hash in)")
    print("targets (apportion): single <= 150 ns, batched <= 10 ns")


if __name__ == "__main__":
    main()
