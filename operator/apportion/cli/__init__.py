"""The `apportion` command line.

Each subcommand lives in its own module of this package, named after the command with dashes as
underscores, and exposes ``register(subparsers)``; heavy imports stay inside the command's
function so that `apportion locate` does not pay for kopf.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = (
    "dev-cluster",
    "crds",
    "operator",
    "locate",
    "plan",
    "simulate",
    "explain",
    "demo",
    "demo-worker",
    "demo-traffic",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apportion", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"apportion.cli.{name.replace('-', '_')}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
