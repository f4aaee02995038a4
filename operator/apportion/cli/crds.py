"""`apportion crds`: generate the CustomResourceDefinitions from the API models, or migrate what
a cluster stores to their storage version (cli.storage_migration)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "crds",
        help="generate the CRDs from the API models",
        description="Print the CRDs as YAML, write them into a directory (--output), check "
        "that a directory is up to date (--check), or, after an upgrade that changed a CRD's "
        "storage version, rewrite the cluster's objects in it (--migrate-storage).",
    )
    parser.add_argument(
        "--output", "-o", type=Path, metavar="DIR", help="write <plural>.apportion.dev.yaml files"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if DIR (default: crds) differs from the models; write nothing",
    )
    parser.add_argument(
        "--migrate-storage",
        action="store_true",
        help="rewrite every apportion object of the cluster (KUBECONFIG) in its CRD's storage "
        "version, then drop older versions from the CRD's status.storedVersions",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from apportion.api import crdgen

    if args.migrate_storage:
        from apportion.cli import storage_migration

        for migrated in asyncio.run(storage_migration.migrate()):
            print(migrated)
        return 0
    if args.check:
        out_dir = args.output or Path("crds")
        stale = crdgen.stale_crds(out_dir)
        for name in stale:
            print(f"stale: {out_dir / name}", file=sys.stderr)
        if stale:
            print(f"regenerate with: apportion crds --output {out_dir}", file=sys.stderr)
            return 1
        print(f"{out_dir}: up to date")
        return 0
    if args.output:
        for path in crdgen.write_crds(args.output):
            print(f"wrote {path}")
        return 0
    files = crdgen.rendered_files()
    sys.stdout.write(
        "---\n".join(text for name, text in files.items() if name.endswith(".apportion.dev.yaml"))
    )
    return 0
