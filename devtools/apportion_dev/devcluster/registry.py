"""An OCI registry on a dev-cluster (`DevCluster.start(registry=True)`, `apportion dev-cluster
start --registry`): CNCF Distribution (`tools.REGISTRY`, built from its Go module) with its
storage in the cluster's state directory, and what puts a release into it and gets it out again.

A published name keeps its repository path in the registry: `ghcr.io/apportion/apportion:1.2.3`
is `<registry>/apportion/apportion:1.2.3`, the chart `oci://ghcr.io/apportion/charts/apportion`
is `oci://<registry>/apportion/charts/apportion`. So a real node's containerd pulls the published
names unchanged through a mirror (`write_mirrors`: a `hosts.toml` per mirrored registry host),
and no manifest rewrites an image name.

Plain HTTP, not TLS: every client has one standard switch for it (`helm --plain-http`,
`buildah --tls-verify=false`, Flux's `spec.insecure: true`, an `http://` host in containerd's
hosts.toml), while TLS would need the cluster's CA handed to each of them in a different way
(`--ca-file`, `--cert-dir`, a certSecretRef Secret, hosts.toml `ca`); and the registry listens
on the API server's address (loopback, or the real node's bridge), which never leaves the
machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import yaml

from apportion_dev.devcluster.net import http_get
from apportion_dev.devcluster.paths import DevClusterError
from apportion_dev.devcluster.tools import HELM, REGISTRY, ensure_tool

MIRRORED_HOSTS = ("ghcr.io",)
"""Registry hosts whose names a real node pulls from the dev-cluster's registry."""
CHART_REPOSITORY = "apportion/charts"
"""Where charts go, below the registry: the published `oci://ghcr.io/apportion/charts`."""
MANIFESTS_REPOSITORY = "apportion/manifests"
"""Where the install manifests go as a Flux artifact: `oci://ghcr.io/apportion/manifests:<v>`."""
# Flux's OCI artifact media types (what `flux push artifact` writes, source-controller reads).
FLUX_CONFIG = "application/vnd.cncf.flux.config.v1+json"
FLUX_CONTENT = "application/vnd.cncf.flux.content.v1.tar+gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
REF_NAME = "org.opencontainers.image.ref.name"


def binary() -> Path:
    return ensure_tool(REGISTRY) / "registry"


def write_config(directory: Path, address: str, port: int) -> Path:
    """Distribution's configuration: filesystem storage in `directory`, HTTP on address:port."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(directory / "storage")},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {"addr": f"{address}:{port}"},
    }
    path = directory / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def argv(config: Path) -> list[str]:
    return [str(binary()), "serve", str(config)]


def env() -> dict[str, str]:
    # Distribution exports traces by OTLP unless told otherwise; there is no collector here.
    return {**os.environ, "OTEL_TRACES_EXPORTER": "none"}


def ready(registry: str) -> bool:
    """Whether the registry at host:port answers the distribution API's version check."""
    return http_get(f"http://{registry}/v2/")[0] == 200


def repository_path(published: str) -> str:
    """`ghcr.io/apportion/apportion:1.2.3` → `apportion/apportion:1.2.3`: the name below the
    registry host, which a mirror keeps (containerd asks the mirror for the same path)."""
    first, _, rest = published.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        raise DevClusterError(f"{published} does not start with a registry host")
    return rest


def archive_name(archive: Path) -> str:
    """The reference an oci-archive was written with (`buildah push IMG oci-archive:F:NAME`)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise DevClusterError(f"{archive} has no index.json: not an oci-archive")
        index = json.load(member)
    names = [m.get("annotations", {}).get(REF_NAME) for m in index.get("manifests", [])]
    found = [n for n in names if n]
    if len(found) != 1:
        raise DevClusterError(f"{archive} names {found or 'no image'}; give the name to push")
    return str(found[0])


def push_image(archive: Path, registry: str, published: str | None = None) -> str:
    """Push an oci-archive to the registry under its published name's repository path (the
    archive's own reference by default); return the reference pushed.

    `buildah push` reads only its own storage (skopeo, which copies an archive straight to a
    registry, is not installed here): the archive goes through a private, throwaway storage, so
    the machine's images stay as they were. The layers are stored as their uncompressed tar
    streams and compressed again the same way, so the registry gets the archive's digests."""
    if shutil.which("buildah") is None:
        raise DevClusterError("buildah is not installed (Debian: apt-get install buildah)")
    target = f"{registry}/{repository_path(published or archive_name(archive))}"
    with tempfile.TemporaryDirectory(prefix="apportion-push-") as work:
        storage = [f"--root={work}/root", f"--runroot={work}/run", "--storage-driver=vfs"]
        image = buildah(*storage, "pull", "--quiet", f"oci-archive:{archive}").split()[-1]
        buildah(*storage, "push", "--quiet", "--tls-verify=false", image, f"docker://{target}")
    return target


def buildah(*args: str) -> str:
    """Run buildah (chroot isolation: no daemon, no user namespaces) and return its output; a
    failure raises DevClusterError with its stderr."""
    result = subprocess.run(
        ["buildah", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "BUILDAH_ISOLATION": "chroot"},
        check=False,
    )
    if result.returncode != 0:
        command = next(a for a in args if not a.startswith("--"))
        raise DevClusterError(f"buildah {command} failed:\n{result.stderr.strip()[-3000:]}")
    return result.stdout.strip()


def push_chart(chart: Path, registry: str) -> str:
    """`helm push` a packaged chart to `oci://<registry>/apportion/charts`; return the chart's
    OCI reference (without the version)."""
    helm = ensure_tool(HELM) / "helm"
    repository = f"oci://{registry}/{CHART_REPOSITORY}"
    result = subprocess.run(
        [str(helm), "push", str(chart), repository, "--plain-http"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise DevClusterError(f"cannot push {chart} to {repository}:\n{result.stderr.strip()}")
    name = chart.name.rsplit("-", 1)[0]  # apportion-1.2.3.tgz → apportion
    return f"{repository}/{name}"


def push_flux_artifact(archive: Path, registry: str) -> str:
    """Push dist/flux/apportion-manifests-<v>.tar.gz as Flux's OCI artifact (one layer, its
    config and manifest with Flux's media types, as `flux push artifact` does) tagged <v>, over
    the registry's HTTP API (the flux CLI is not built here); return its reference."""
    version = archive.name.removeprefix("apportion-manifests-").removesuffix(".tar.gz")
    base = f"http://{registry}/v2/{MANIFESTS_REPOSITORY}"
    layer, config = archive.read_bytes(), b"{}"
    for blob in (layer, config):
        _upload_blob(base, blob)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": _descriptor(FLUX_CONFIG, config),
        "layers": [_descriptor(FLUX_CONTENT, layer)],
        "annotations": {"org.opencontainers.image.version": version},
    }
    _request(
        "PUT",
        f"{base}/manifests/{version}",
        json.dumps(manifest).encode(),
        {"Content-Type": OCI_MANIFEST},
    )
    return f"oci://{registry}/{MANIFESTS_REPOSITORY}:{version}"


def served_digest(published: str, registry: str) -> str:
    """The manifest digest the registry serves for a published name's tag: what a node that
    pulled it reports in a pod's `imageID`."""
    repository, tag = repository_path(published).rsplit(":", 1)
    accept = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST))
    headers = _request(
        "HEAD", f"http://{registry}/v2/{repository}/manifests/{tag}", b"", {"Accept": accept}
    )
    return str(headers["Docker-Content-Digest"])


def _descriptor(media_type: str, blob: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": _digest(blob), "size": len(blob)}


def _digest(blob: bytes) -> str:
    return f"sha256:{hashlib.sha256(blob).hexdigest()}"


def _upload_blob(base: str, blob: bytes) -> None:
    """The distribution spec's monolithic upload: POST for a session, PUT the bytes to it."""
    location = _request("POST", f"{base}/blobs/uploads/", b"", {})["Location"]
    if location.startswith("/"):
        location = base.split("/v2/", 1)[0] + location
    separator = "&" if "?" in location else "?"
    _request(
        "PUT",
        f"{location}{separator}digest={_digest(blob)}",
        blob,
        {"Content-Type": "application/octet-stream"},
    )


def _request(method: str, url: str, body: bytes, headers: dict[str, str]) -> Message:
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as answer:
            answered: Message = answer.headers
            return answered
    except urllib.error.HTTPError as error:
        raise DevClusterError(f"{method} {url}: {error.code} {error.read().decode()}") from error


def publish(dist: Path, registry: str) -> list[str]:
    """Push a release's images (dist/images/*.oci.tar), charts (dist/charts/*.tgz) and Flux
    artifacts (dist/flux/*.tar.gz); return what was pushed."""
    pushed = [push_image(a, registry) for a in sorted((dist / "images").glob("*.oci.tar"))]
    pushed += [push_chart(c, registry) for c in sorted((dist / "charts").glob("*.tgz"))]
    pushed += [push_flux_artifact(a, registry) for a in sorted((dist / "flux").glob("*.tar.gz"))]
    return pushed


def hosts_toml(upstream: str, registry: str) -> str:
    """containerd's host configuration for `upstream`: resolve and pull from the registry over
    plain HTTP first. The path is kept (`/v2/<repository>/...`, containerd's default), which is
    where `push_image` put it; `server` stays upstream, as a mirror's configuration does."""
    return (
        f'server = "https://{upstream}"\n\n'
        f'[host."http://{registry}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
    )


def write_mirrors(hosts_dir: Path, registry: str) -> None:
    """A `<host>/hosts.toml` per mirrored host below containerd's `config_path`."""
    for upstream in MIRRORED_HOSTS:
        (hosts_dir / upstream).mkdir(parents=True, exist_ok=True)
        (hosts_dir / upstream / "hosts.toml").write_text(hosts_toml(upstream, registry))
