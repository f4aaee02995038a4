"""The `apportion` command line.

Each subcommand lives in its own module of this package, named after the command with dashes as
underscores, and exposes ``register(subparsers)``; heavy imports stay inside the command's
function so that `apportion locate` does not pay for kopf. Other distributions add commands
through the entry points `apportion.commands` (name → its ``register``): the harness in
devtools/ adds dev-cluster and the demo commands this way.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

SUBCOMMANDS = ("crds", "operator", "locate", "plan", "simulate", "explain")
COMMAND_ENTRY_POINTS = "apportion.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="apportion", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"apportion.cli.{name.replace('-', '_')}")
        module.register(subparsers)
    for plugged in sorted(entry_points(group=COMMAND_ENTRY_POINTS), key=lambda e: e.name):
        if plugged.name not in SUBCOMMANDS:
            plugged.load()(subparsers)
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
