"""The krew release of `kubectl apportion`: a reproducible archive of plugins/krew's launcher and
the project's LICENSE (krew's index wants one in every archive), with fixed owner, mode and
times so the same files always hash the same, and the manifest's version and sha256 to match.

    python scripts/krew.py --out dist [--update-manifest]

prints the archive's path and sha256; --update-manifest rewrites plugins/krew/apportion.yaml.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import re
import sys
import tarfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "plugins" / "krew"
MANIFEST = PLUGIN / "apportion.yaml"
LAUNCHER = "kubectl-apportion"
RELEASES = "https://github.com/apportion/apportion/releases/download"


def version() -> str:
    return "v" + tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def archive_name() -> str:
    return f"kubectl-apportion-{version()}.tar.gz"


def build_archive(out: Path) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for source, mode in ((PLUGIN / LAUNCHER, 0o755), (REPO / "LICENSE", 0o644)):
            data = source.read_bytes()
            entry = tarfile.TarInfo(source.name)
            entry.size, entry.mode, entry.mtime = len(data), mode, 0
            tar.addfile(entry, io.BytesIO(data))
    out.mkdir(parents=True, exist_ok=True)
    path = out / archive_name()
    with path.open("wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def update_manifest(digest: str) -> None:
    text = MANIFEST.read_text()
    text = re.sub(r"(?m)^(  version: ).*$", rf"\g<1>{version()}", text)
    text = re.sub(r"(?m)^(\s+uri: ).*$", rf"\g<1>{RELEASES}/{version()}/{archive_name()}", text)
    text = re.sub(r"(?m)^(\s+sha256: ).*$", rf"\g<1>{digest}", text)
    MANIFEST.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--update-manifest", action="store_true")
    args = parser.parse_args(argv)
    path = build_archive(args.out)
    digest = sha256(path)
    if args.update_manifest:
        update_manifest(digest)
    print(f"{path} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
