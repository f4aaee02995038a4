"""Runs every benchmark in bench/ (each `bench_*.py`, in name order) and prints their tables.

Quick mode by default (each script gets `--quick`; every bench script must accept it), so that
`make bench` finishes in minutes on a 2-core machine; `--full` runs them as they run alone. The
scripts run one after another, never in parallel, so that their timings do not disturb each
other, each as a module from the repository root (`python -m bench.bench_NAME`: they import the
tests' helpers as `tests.support.*`). Exit code 1 if any script failed; the summary says which.

Run: .venv/bin/python -m bench.run_all [--full] [NAME ...]   (NAME: e.g. keys, allocation)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def scripts(names: list[str]) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if not names:
        return found
    by_name = {p.stem.removeprefix("bench_"): p for p in found}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        known = ", ".join(by_name)
        raise SystemExit(f"run_all: unknown benchmark {unknown[0]!r} (known: {known})")
    return [by_name[n] for n in names]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="run without --quick")
    parser.add_argument("names", nargs="*", metavar="NAME", help="only these (default: all)")
    args = parser.parse_args()
    summary: list[tuple[str, int, float]] = []
    for script in scripts(args.names):
        quick = [] if args.full else ["--quick"]
        command = [sys.executable, "-m", f"bench.{script.stem}", *quick]
        print(
            f"\n######## {script.name} {'(full)' if args.full else '(quick)'} ########", flush=True
        )
        start = time.perf_counter()
        # Output streams straight through: long benchmarks show their tables as they go.
        code = subprocess.run(command, cwd=REPO, check=False).returncode
        summary.append((script.name, code, time.perf_counter() - start))
    print("\n######## summary ########")
    for name, code, seconds in summary:
        status = "ok" if code == 0 else f"FAILED (exit {code})"
        print(f"  {name:<28} {status:<16} {seconds:7.1f} s")
    return 1 if any(code for _, code, _ in summary) else 0


if __name__ == "__main__":
    sys.exit(main())
