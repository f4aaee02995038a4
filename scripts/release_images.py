"""The release's two images, built with buildah from the Dockerfile by the same code that builds
the dev-cluster's real node image (apportion_dev.devcluster.realnode.images: its base fallback,
CA bundle and layer cache), each saved as an oci-archive with the OCI annotations a registry
shows, and a CycloneDX SBOM of its Python environment:

    python scripts/release_images.py --version 0.1.0 --dist dist [--revision <commit>]

writes dist/images/<name>-<v>.oci.tar and dist/sbom/<name>-<v>.cdx.json for
- apportion: the operator (the product: EXTRAS=operator, no devtools/);
- apportion-demo: the demo workers' image (what the real node runs: psycopg and devtools/).

The SBOM is made by CycloneDX's own tool for Python (`cyclonedx-py environment`) run *inside*
the image with `buildah run`, over its /opt/apportion venv: the tool learns an environment's
packages by running that environment's interpreter, and the image's interpreter only runs in the
image's own root (its venv links to the base's absolute python path, which on a `buildah mount`
would name the host's interpreter, of another version, or none). The tool goes into a throwaway
venv in the container's /tmp, never into the image.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.realnode import images

REPO = Path(__file__).resolve().parents[1]
REGISTRY = "ghcr.io/apportion"
SOURCE = "https://github.com/apportion/apportion"
LICENSES = "Apache-2.0"
# CycloneDX's Python SBOM tool, pinned so that a release's SBOMs do not change format unasked.
SBOM_TOOL = "cyclonedx-bom==7.5.0"
SBOM_MOUNT = "/sbom"
CA_MOUNT = "/run/apportion-ca.crt"


@dataclass(frozen=True)
class Image:
    name: str
    extras: str
    devtools: bool
    description: str

    def tag(self, version: str) -> str:
        return f"{REGISTRY}/{self.name}:{version}"

    def archive(self, dist: Path, version: str) -> Path:
        return dist / "images" / f"{self.name}-{version}.oci.tar"

    def sbom(self, dist: Path, version: str) -> Path:
        return dist / "sbom" / f"{self.name}-{version}.cdx.json"


OPERATOR = Image(
    "apportion",
    "operator",
    False,
    "The apportion operator: places grains, partitions and shards on worker pods",
)
# The real node's image, published: the samples' workers (manifests/samples) run it.
DEMO = Image(
    "apportion-demo",
    images.EXTRAS,
    True,
    "apportion's demo workers (apportion demo-worker): the operator image plus the harness",
)
IMAGES = (OPERATOR, DEMO)


def oci_annotations(image: Image, version: str, revision: str, created: datetime) -> dict[str, str]:
    """The OCI pre-defined annotations (image-spec annotations.md) a registry shows."""
    prefix = "org.opencontainers.image"
    return {
        f"{prefix}.title": image.name,
        f"{prefix}.description": image.description,
        f"{prefix}.version": version,
        f"{prefix}.revision": revision,
        f"{prefix}.source": SOURCE,
        f"{prefix}.url": SOURCE,
        f"{prefix}.licenses": LICENSES,
        f"{prefix}.created": created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def created_at() -> datetime:
    """$SOURCE_DATE_EPOCH (reproducible builds' convention) when set, else now."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    return datetime.fromtimestamp(int(epoch), UTC) if epoch else datetime.now(UTC)


def build_one(image: Image, version: str, dist: Path, revision: str, created: datetime) -> Path:
    """Build, tag and save one image as an oci-archive whose index names the tag."""
    tag = image.tag(version)
    images.build_image(
        tag=tag,
        extras=image.extras,
        devtools=image.devtools,
        annotations=oci_annotations(image, version, revision, created),
        context=REPO,  # this script's tree, which a test may have stamped with another version
    )
    archive = image.archive(dist, version)
    archive.parent.mkdir(parents=True, exist_ok=True)
    archive.unlink(missing_ok=True)
    images.buildah("push", "--quiet", tag, f"oci-archive:{archive}:{tag}")
    return archive


def sbom(image: Image, version: str, dist: Path) -> Path:
    """`cyclonedx-py environment` over the image's venv, run in a container of the image."""
    out = image.sbom(dist, version)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    script = (
        "python3 -m venv /tmp/cyclonedx"
        f" && /tmp/cyclonedx/bin/pip install --quiet --disable-pip-version-check '{SBOM_TOOL}'"
        " && /tmp/cyclonedx/bin/cyclonedx-py environment --output-reproducible"
        " --spec-version 1.6 --output-format JSON"
        f" --output-file {SBOM_MOUNT}/{out.name} /opt/apportion"
    )
    volumes = ["--volume", f"{out.parent}:{SBOM_MOUNT}"]
    bundle = images.ca_bundle()
    if bundle is not None:
        volumes += ["--volume", f"{bundle}:{CA_MOUNT}:ro", "--env", f"PIP_CERT={CA_MOUNT}"]
    container = images.buildah("from", "--pull-never", image.tag(version))
    try:
        images.buildah("run", "--user", "0:0", *volumes, container, "--", "sh", "-c", script)
    finally:
        images.buildah("rm", container, check=False)
    if not out.is_file():
        raise DevClusterError(f"cyclonedx-py wrote no {out}")
    document = json.loads(out.read_text())
    document["metadata"]["component"] = subject(image, version)
    out.write_text(json.dumps(document, indent=2) + "\n")
    return out


def subject(image: Image, version: str) -> dict[str, str]:
    """What the SBOM describes: the image (the tool, run over a venv, names no main component)."""
    return {
        "type": "container",
        "bom-ref": image.tag(version),
        "name": f"{REGISTRY}/{image.name}",
        "version": version,
    }


def build(version: str, dist: Path, revision: str) -> list[Path]:
    """Both images and their SBOMs into `dist`; the files written."""
    created = created_at()
    written: list[Path] = []
    for image in IMAGES:
        written.append(build_one(image, version, dist, revision, created))
        written.append(sbom(image, version, dist))
    return written


def head_revision() -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--dist", type=Path, default=REPO / "dist")
    parser.add_argument("--revision", help="the commit the images are built from (default HEAD)")
    args = parser.parse_args(argv)
    for path in build(args.version, args.dist.resolve(), args.revision or head_revision()):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
