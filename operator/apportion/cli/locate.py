"""`apportion locate`: the unit (partition, shard) of each ID under a key scheme."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apportion.api.assignment import AssignmentTable
    from apportion.engine.locate import Location

SCHEMES = ("apportion", "netherite", "akka")
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "locate",
        help="print the unit of each ID",
        description="Prints ID<TAB>unit for each ID (or a JSON list with --json). Schemes: "
        "netherite (!n suffix, else FNV-1a-32 mod n), akka (abs(String.hashCode mod n)), "
        "apportion (xxh3 multiply-shift, !n suffix; the default).",
    )
    parser.add_argument("ids", nargs="*", metavar="ID", help="IDs to locate")
    parser.add_argument("--scheme", choices=SCHEMES, default="apportion", help="key scheme")
    parser.add_argument("--count", type=int, metavar="N", help="number of units")
    parser.add_argument(
        "--table",
        metavar="FILE",
        help="a published assignment (its ConfigMap as JSON, e.g. `kubectl get cm "
        "<set>-partitionset-assignment -o json`, or the document itself; - for stdin): print "
        "ID, unit, pod, and the unit under the previous count while a resharding's lineage is "
        "in the table; --scheme and --count come from it",
    )
    parser.add_argument("--json", action="store_true", help='print [{"id", "unit"}, ...]')
    parser.add_argument(
        "--from-file", metavar="FILE", help="read IDs from FILE (- for stdin), one a line"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from apportion.engine.keys import MAX_COUNT
    from apportion.engine.locate import locate

    table = None
    if args.table is not None:
        try:
            table = _read_table(args.table)
        except (OSError, ValueError) as exc:
            print(f"apportion locate: cannot use {args.table}: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    elif args.count is None or not 1 <= args.count <= MAX_COUNT:
        print(
            f"apportion locate: --count must be 1..{MAX_COUNT} (or give --table)", file=sys.stderr
        )
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
    found = locate(ids, scheme=args.scheme, count=args.count, table=table)
    if args.json:
        json.dump([f.to_json() for f in found], sys.stdout, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.writelines(located_lines(found, table))
    return 0


def located_lines(found: Sequence[Location], table: AssignmentTable | None) -> list[str]:
    """ID<TAB>unit, and with a table <TAB>pod and the unit under the previous count."""
    if table is None:
        return [f"{f.id}\t{f.unit}\n" for f in found]
    lines = []
    for f in found:
        extra = "" if f.previous_unit is None else f"\t(was {f.previous_unit} of "
        extra += "" if table.lineage is None else f"{table.lineage.from_count})"
        lines.append(f"{f.id}\t{f.unit}\t{f.owner or '-'}{extra}\n")
    return lines


def _read_table(path: str) -> AssignmentTable:
    """An assignment from a root ConfigMap (inline or gzip; chunked tables need the API) or
    from the document itself."""
    from apportion.api.assignment import ConfigMapPayload, decode_assignment, from_document

    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    doc = json.loads(text)
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        name = doc.get("metadata", {}).get("name", "")
        return decode_assignment([ConfigMapPayload.from_configmap(doc, name)])
    return from_document(doc)
