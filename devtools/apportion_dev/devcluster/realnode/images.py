"""Images for the real node, built here with buildah (no Docker engine, no reachable registry):
the project's image from its Dockerfile, the pod sandbox's pause image, metrics-server's, and,
where the Dockerfile's default base cannot be pulled, a local Debian base to build on.

`make image` builds the project's image; the node imports every image into containerd at start,
the project's under the names manifests/ and its samples publish it as (`published_names`), so
that they run on the node unchanged. The release (scripts/release_images.py) builds the published
images with the same code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from apportion_dev.devcluster.paths import DevClusterError, module_dir
from apportion_dev.devcluster.state import mounts_under

IMAGE = "localhost/apportion:dev"
# The repositories manifests/ (the operator) and its samples (the demo workers) name, tagged with
# the tree's VERSION. The image built here holds both: the product plus devtools/ (`apportion
# demo-worker`), so the node gives it both names; the release builds them apart.
PUBLISHED_REPOSITORIES = ("ghcr.io/apportion/apportion", "ghcr.io/apportion/apportion-demo")
LOCAL_BASE = "localhost/apportion-base:bookworm"
UPSTREAM_BASE = "docker.io/library/python:3.11-slim"  # the Dockerfile's default BASE
PAUSE_IMAGE = "localhost/apportion/pause:1"
METRICS_SERVER_IMAGE = "localhost/apportion/metrics-server:dev"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What the Dockerfile needs of a base: python3 with venv (the key kernel needs libc alone).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
# The Dockerfile's EXTRAS for the image built here: psycopg beside the operator's, so that the
# demo workers on the real node can make fenced writes (tests/e2e/test_real_node_workloads.py).
EXTRAS = "operator,postgres"
NONROOT = "65534:65534"
MTIME = "dev.apportion.binary-mtime"

Progress = Callable[[str], None]


def _say(message: str) -> None:
    print(f"[image] {message}", flush=True)


def published_names() -> list[str]:
    """The names this checkout's manifests give the image built here, at its VERSION."""
    version = (source_root() / "VERSION").read_text().strip()
    return [f"{repository}:{version}" for repository in PUBLISHED_REPOSITORIES]


def source_root() -> Path:
    """The checkout holding the Dockerfile (the control-plane module lives in its devtools/go)."""
    root = module_dir().parents[2]
    if not (root / "Dockerfile").is_file():
        raise DevClusterError(f"no Dockerfile in {root}: build images from a source checkout")
    return root


def buildah(*args: str, check: bool = True, timeout: float | None = None) -> str:
    if shutil.which("buildah") is None:
        raise DevClusterError("buildah is not installed (Debian: apt-get install buildah)")
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
    result = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise DevClusterError(f"buildah {args[0]} failed:\n{result.stderr.strip()[-3000:]}")
    return result.stdout.strip()


def exists(image: str) -> bool:
    return bool(buildah("images", "--quiet", image, check=False))


def ca_bundle() -> Path | None:
    """The CA bundle this machine's pip trusts, lent to the build for its pip step only."""
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("SSL_CERT_FILE"),
        "/etc/ssl/certs/ca-certificates.crt",
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def ensure_base(progress: Progress = _say) -> str:
    """The base to build on: $APPORTION_IMAGE_BASE if set, else the Dockerfile's default when it
    can be pulled, else a local Debian base (made once)."""
    chosen = os.environ.get("APPORTION_IMAGE_BASE")
    if chosen:
        return chosen
    if exists(LOCAL_BASE):
        return LOCAL_BASE
    if exists(UPSTREAM_BASE) or _try_pull(UPSTREAM_BASE):
        return UPSTREAM_BASE
    progress(f"{UPSTREAM_BASE} cannot be pulled; making {LOCAL_BASE} from Debian packages")
    make_local_base(progress)
    return LOCAL_BASE


def _try_pull(image: str) -> bool:
    try:
        buildah("pull", "--quiet", image, timeout=120)
    except (DevClusterError, subprocess.TimeoutExpired):
        return False
    return True


def make_local_base(progress: Progress = _say) -> None:
    """debootstrap a minimal Debian with python3, packed into an image from scratch."""
    if shutil.which("debootstrap") is None:
        raise DevClusterError("debootstrap is not installed (Debian: apt-get install debootstrap)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="apportion-base-") as work:
        rootfs = Path(work) / "rootfs"
        result = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                DEBIAN_SUITE,
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        _unmount_below(rootfs)  # debootstrap leaves /proc mounted when it fails
        if result.returncode != 0:
            raise DevClusterError(f"debootstrap failed:\n{result.stdout[-2000:]}{result.stderr}")
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / leftover).glob("*"):
                if item.is_file():
                    item.unlink()
        archive = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        container = buildah("from", "scratch")
        try:
            buildah("add", container, str(archive), "/")
            buildah("config", "--cmd", "python3", "--env", "LANG=C.UTF-8", container)
            buildah("commit", "--rm", container, LOCAL_BASE)
        except DevClusterError:
            buildah("rm", container, check=False)
            raise
    progress(f"{LOCAL_BASE} made in {time.monotonic() - started:.0f}s")


def _unmount_below(root: Path) -> None:
    for point in reversed(mounts_under(root)):
        subprocess.run(["umount", "-l", point], check=False)


def build_image(
    progress: Progress = _say,
    tag: str = IMAGE,
    extras: str = EXTRAS,
    devtools: bool = True,
    annotations: Mapping[str, str] | None = None,
    context: Path | None = None,
) -> str:
    """Build the project's image from the Dockerfile of `context` (this checkout by default)
    with the pip `extras`, with devtools/ (the harness the demo workers run from) unless told
    otherwise, and `annotations` both as OCI manifest annotations (what a registry shows) and as
    labels (what `docker inspect` shows); layers are cached between builds."""
    base = ensure_base(progress)
    root = context or source_root()
    started = time.monotonic()
    args = ["bud", "--layers", "--build-arg", f"BASE={base}", "--build-arg", f"EXTRAS={extras}"]
    if devtools:
        args += ["--build-arg", "DEVTOOLS=1"]
    for name, value in (annotations or {}).items():
        args += ["--annotation", f"{name}={value}", "--label", f"{name}={value}"]
    args += ["-t", tag, "-f", "Dockerfile"]
    bundle = ca_bundle()
    if bundle is not None:
        args += ["--secret", f"id=ca-bundle,src={bundle}"]
    args.append(str(root))
    buildah(*args)
    progress(f"{tag} built on {base} in {time.monotonic() - started:.0f}s ({size(tag)})")
    return tag


def size(image: str) -> str:
    return buildah("images", "--format", "{{.Size}}", image).splitlines()[0]


def _from_scratch(tag: str, binary: Path, entrypoint: str, annotation: str = "") -> None:
    """An image of one static binary, run as nobody."""
    container = buildah("from", "scratch")
    try:
        buildah("copy", "--chmod", "0755", container, str(binary), entrypoint)
        config = ["--entrypoint", f'["{entrypoint}"]', "--user", NONROOT]
        if annotation:
            config += ["--annotation", annotation]
        buildah("config", *config, container)
        buildah("commit", "--rm", container, tag)
    except DevClusterError:
        buildah("rm", container, check=False)
        raise


def ensure_pause_image() -> str:
    """The sandbox image containerd pins: a static C program, from scratch."""
    if exists(PAUSE_IMAGE):
        return PAUSE_IMAGE
    source = module_dir().parent / "realnode" / "pause" / "pause.c"
    with tempfile.TemporaryDirectory(prefix="apportion-pause-") as work:
        binary = Path(work) / "pause"
        result = subprocess.run(
            ["cc", "-static", "-Os", "-s", "-o", str(binary), str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise DevClusterError(f"cannot compile {source}: {result.stderr.strip()}")
        _from_scratch(PAUSE_IMAGE, binary, "/pause")
    return PAUSE_IMAGE


def ensure_metrics_server_image(binary: Path) -> str:
    """metrics-server's static binary from scratch, rebuilt when the binary changes."""
    label = f"{binary.stat().st_mtime_ns}"
    if exists(METRICS_SERVER_IMAGE) and label in buildah(
        "inspect", "--type", "image", "--format", "{{.ImageAnnotations}}", METRICS_SERVER_IMAGE
    ):
        return METRICS_SERVER_IMAGE
    _from_scratch(METRICS_SERVER_IMAGE, binary, "/metrics-server", f"{MTIME}={label}")
    return METRICS_SERVER_IMAGE


def import_into_containerd(
    images: list[str],
    ctr: Path,
    addresses: list[Path],
    work: Path,
    aliases: Mapping[str, list[str]],
) -> None:
    """Hand images to every node's containerd (its k8s.io namespace, which the kubelet uses),
    each exported once and imported into all nodes at the same time, and tagged there with its
    `aliases` too (containerd's tags only: the names in buildah's storage stay the release's)."""
    for image in images:
        archive = work / "image.tar"
        buildah("push", "--quiet", image, f"docker-archive:{archive}:{image}")
        imports = [
            subprocess.Popen(
                [ctr, f"--address={address}", "--namespace=k8s.io", "images", "import", archive],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for address in addresses
        ]
        errors = [i.communicate()[1].strip() for i in imports]
        archive.unlink(missing_ok=True)
        for process, error in zip(imports, errors, strict=True):
            if process.returncode != 0:
                raise DevClusterError(f"ctr could not import {image}: {error}")
        for address in addresses:
            for alias in aliases.get(image, []):
                _ctr(ctr, address, "images", "tag", "--force", image, alias)


def _ctr(ctr: Path, address: Path, *args: str) -> None:
    result = subprocess.run(
        [ctr, f"--address={address}", "--namespace=k8s.io", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise DevClusterError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
