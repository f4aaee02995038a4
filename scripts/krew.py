"""The krew release of `kubectl apportion`: a reproducible archive of plugins/krew's launcher and
the project's LICENSE (krew's index wants one in every archive), with fixed owner, mode and
times so the same files always hash the same, and the manifest's version and sha256 to match.

    python scripts/krew.py --out dist [--update-manifest]
    python scripts/krew.py --out dist/krew --version 0.2.0 --manifest dist/krew/apportion.yaml

prints the archive's path and sha256; --update-manifest rewrites plugins/krew/apportion.yaml,
--manifest writes the manifest elsewhere (a release's, whose --version is not the tree's).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import re
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "plugins" / "krew"
MANIFEST = PLUGIN / "apportion.yaml"
LAUNCHER = "kubectl-apportion"
RELEASES = "https://github.com/apportion/apportion/releases/download"


def version() -> str:
    """The tree's version, krew's way (v-prefixed)."""
    return f"v{(REPO / 'VERSION').read_text().strip()}"


def archive_name(tag: str) -> str:
    return f"kubectl-apportion-{tag}.tar.gz"


def build_archive(out: Path, tag: str) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for source, mode in ((PLUGIN / LAUNCHER, 0o755), (REPO / "LICENSE", 0o644)):
            data = source.read_bytes()
            entry = tarfile.TarInfo(source.name)
            entry.size, entry.mode, entry.mtime = len(data), mode, 0
            tar.addfile(entry, io.BytesIO(data))
    out.mkdir(parents=True, exist_ok=True)
    path = out / archive_name(tag)
    with path.open("wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stamp_manifest(text: str, tag: str, digest: str) -> str:
    """The manifest naming version `tag`, its archive on the GitHub release of that tag, and the
    archive's sha256."""
    text = re.sub(r"(?m)^(  version: ).*$", rf"\g<1>{tag}", text)
    text = re.sub(r"(?m)^(\s+uri: ).*$", rf"\g<1>{RELEASES}/{tag}/{archive_name(tag)}", text)
    return re.sub(r"(?m)^(\s+sha256: ).*$", rf"\g<1>{digest}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--version", help="x.y.z (default: the tree's, from pyproject.toml)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--update-manifest", action="store_true")
    target.add_argument("--manifest", type=Path, help="write the stamped manifest here")
    args = parser.parse_args(argv)
    tag = f"v{args.version}" if args.version else version()
    path = build_archive(args.out, tag)
    digest = sha256(path)
    manifest = MANIFEST if args.update_manifest else args.manifest
    if manifest is not None:
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(stamp_manifest(MANIFEST.read_text(), tag, digest))
    print(f"{path} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
