"""`apportion plan`: plan one allocation round for a snapshot (docs/snapshot.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan unit moves for a snapshot of members and assignment",
        description="Reads a snapshot (strategy, members, assignment, optional loads) and prints "
        'the plan as JSON: {"moves": [{"unit", "from", "to"}], "assignment": {member: [units]}, '
        '"metrics": {...}}. Bad snapshots exit with code 2.',
    )
    parser.add_argument(
        "--input", "-i", required=True, metavar="FILE", help="snapshot JSON file, or - for stdin"
    )
    parser.add_argument("--compact", action="store_true", help="print JSON on one line")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from apportion.engine.allocation import AllocationError
    from apportion.engine.snapshot import parse_snapshot, plan_snapshot

    try:
        if args.input == "-":
            text = sys.stdin.read()
        else:
            with open(args.input, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        print(f"apportion plan: cannot read {args.input}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        plan = plan_snapshot(parse_snapshot(text))
    except AllocationError as exc:
        print(f"apportion plan: bad snapshot: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    document = plan.to_json()
    if args.compact:
        sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render(document))
    return 0


def render(document: dict[str, Any]) -> str:
    """The plan as JSON with one move and one member per line, for people reading it."""

    def line(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    def block(items: list[str], open_: str, close: str) -> str:
        if not items:
            return open_ + close
        return open_ + "\n" + ",\n".join(f"    {item}" for item in items) + "\n  " + close

    parts = []
    for key, value in document.items():
        if key == "moves":
            text = block([line(m) for m in value], "[", "]")
        elif key == "assignment":
            text = block([f"{line(m)}: {line(units)}" for m, units in value.items()], "{", "}")
        elif key == "metrics":
            text = block([f"{line(k)}: {line(v)}" for k, v in value.items()], "{", "}")
        else:
            text = line(value)
        parts.append(f"  {line(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"
