"""`apportion locate`: the unit (partition, shard) of each ID under a key scheme."""

from __future__ import annotations

import argparse
import json
import sys

SCHEMES = ("apportion", "netherite", "akka")
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "locate",
        help="print the unit of each ID",
        description="Prints ID<TAB>unit for each ID (or a JSON list with --json). Schemes: "
        "netherite (!n suffix, else FNV-1a-32 mod n), akka (abs(String.hashCode mod n)), "
        "apportion (xxh3 multiply-shift, !n suffix; the default).",
    )
    parser.add_argument("ids", nargs="*", metavar="ID", help="IDs to locate")
    parser.add_argument("--scheme", choices=SCHEMES, default="apportion", help="key scheme")
    parser.add_argument("--count", type=int, required=True, metavar="N", help="number of units")
    parser.add_argument("--json", action="store_true", help='print [{"id", "unit"}, ...]')
    parser.add_argument(
        "--from-file", metavar="FILE", help="read IDs from FILE (- for stdin), one a line"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from apportion.engine.keys import MAX_COUNT, get_scheme

    if not 1 <= args.count <= MAX_COUNT:
        print(f"apportion locate: --count must be 1..{MAX_COUNT}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ids = list(args.ids)
    if args.from_file is not None:
        try:
            if args.from_file == "-":
                text = sys.stdin.read()
            else:
                with open(args.from_file, encoding="utf-8") as f:
                    text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"apportion locate: cannot read {args.from_file}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        # One ID a line; the line break (LF or CRLF) is not part of the ID; empty lines are skipped.
        ids.extend(line.removesuffix("\r") for line in text.split("\n") if line.strip("\r"))
    if not ids:
        print("apportion locate: no IDs given (arguments or --from-file)", file=sys.stderr)
        return EXIT_BAD_INPUT
    units = get_scheme(args.scheme).units(ids, args.count).tolist()
    if args.json:
        json.dump(
            [{"id": i, "unit": u} for i, u in zip(ids, units, strict=True)],
            sys.stdout,
            ensure_ascii=False,
        )
        sys.stdout.write("\n")
    else:
        sys.stdout.writelines(f"{i}\t{u}\n" for i, u in zip(ids, units, strict=True))
    return 0
