"""The registries a dev-cluster serves a release from (`DevCluster.start(registry=True,
dist=...)`, docs/dev-cluster.md), used by the real clients a user has: an image and a chart put
into dist/ as `make release` writes them are pushed at start and pulled back with buildah and
helm, the chart also by Flux's source-controller (an OCIRepository with `insecure: true`); a
wheel in dist/python is downloaded by pip from the index, a jar deployed into dist/maven by Maven
from the repository; and on the real node a pod whose image is a published name
(`ghcr.io/apportion/...`) runs from an image containerd pulled through its mirror.

Every artifact is made here, with a name and version nothing else has, so what comes back can
only have come from these registries; it is compared byte for byte (or by image ID) with what
went in.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from apportion_dev.devcluster import DevCluster
from apportion_dev.devcluster.flux import Flux
from apportion_dev.devcluster.registry import buildah, push_image
from tests.support.java import local_repository
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
PAUSE_SOURCE = REPO / "devtools" / "go" / "realnode" / "pause" / "pause.c"
CHART_VERSION = "0.3.0"
WHEEL_VERSIONS = ("1.0.0", "1.1.0")
MAVEN_VERSION = "1.2.3"


def scratch_image(archive: Path, published: str, files: dict[str, Path], entrypoint: str) -> str:
    """An image from scratch holding `files` (path in image → file here), written as an
    oci-archive named `published`, as `make release` writes dist/images; returns its image ID."""
    container = buildah("from", "scratch")
    local = f"localhost/registry-test-{secrets.token_hex(4)}:1"
    try:
        for target, source in files.items():
            buildah("copy", "--chmod", "0755", container, str(source), target)
        buildah("config", "--entrypoint", json.dumps([entrypoint]), "--user", "65534", container)
        image_id = buildah("commit", "--quiet", "--rm", container, local)
    except AssertionError:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
        raise
    try:
        buildah("push", "--quiet", local, f"oci-archive:{archive}:{published}")
    finally:
        buildah("rmi", local)
    return image_id


def pause_binary(directory: Path) -> Path:
    """A static program that sleeps until it is signalled: an image of it runs as a pod."""
    binary = directory / "pause"
    subprocess.run(
        ["cc", "-static", "-Os", "-s", "-o", str(binary), str(PAUSE_SOURCE)],
        check=True,
        capture_output=True,
    )
    return binary


def tiny_wheel(directory: Path, version: str) -> Path:
    """A wheel of the project `apportion` at `version`, made by hand: what pip checks of a
    download is its name, version and sha256."""
    wheel = directory / f"apportion-{version}-py3-none-any.whl"
    info = f"apportion-{version}.dist-info"
    files = {
        "apportion_probe.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: apportion\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: "
        "py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            archive.writestr(name, text)
    return wheel


def maven(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        [
            "mvn",
            "--batch-mode",
            "--no-transfer-progress",
            f"-Dmaven.repo.local={local_repository()}",
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:]
    return result.stdout


@dataclass
class Release:
    """What the test put into dist/ and how to recognise it when it comes back."""

    dist: Path
    image: str  # its published name
    image_id: str
    wheels: dict[str, Path]
    group: str  # the Maven groupId, unique to this run
    jar: Path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    work = tmp_path_factory.mktemp("release")
    dist = work / "dist"
    for directory in ("images", "charts", "python", "maven"):
        (dist / directory).mkdir(parents=True)
    tag = secrets.token_hex(4)
    published = f"ghcr.io/apportion/registry-probe:{tag}"
    note = work / "note.txt"
    note.write_text(f"release {tag}\n")
    image_id = scratch_image(
        dist / "images" / f"registry-probe-{tag}.oci.tar",
        published,
        {"/pause": pause_binary(work), "/note.txt": note},
        "/pause",
    )
    wheels = {v: tiny_wheel(dist / "python", v) for v in WHEEL_VERSIONS}
    group = f"dev.apportion.probe{tag}"
    jar = work / "tiny.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        archive.writestr("probe.txt", tag)
    maven(
        "org.apache.maven.plugins:maven-deploy-plugin:deploy-file",
        f"-Durl=file:{dist / 'maven'}",
        f"-Dfile={jar}",
        f"-DgroupId={group}",
        "-DartifactId=tiny",
        f"-Dversion={MAVEN_VERSION}",
        "-Dpackaging=jar",
        cwd=work,
    )
    return Release(dist, published, image_id, wheels, group, jar)


@pytest.fixture(scope="module")
def chart(release: Release, helm: Callable[..., subprocess.CompletedProcess[str]]) -> Path:
    """A chart made by `helm create`, packaged into dist/charts."""
    source = release.dist.parent / "tiny"
    helm("create", str(source))
    helm("package", str(source), "--version", CHART_VERSION, "-d", str(release.dist / "charts"))
    return release.dist / "charts" / f"tiny-{CHART_VERSION}.tgz"


@pytest.fixture(scope="module")
def served(
    release: Release, chart: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevCluster]:
    """A dev-cluster with its registries over the release (no pods run here: no simulator)."""
    cluster = DevCluster.start(
        tmp_path_factory.mktemp("cluster"), pod_simulator=False, dist=release.dist
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def test_the_image_pushed_at_start_is_pulled_back_by_buildah(
    served: DevCluster, release: Release
) -> None:
    assert served.registry is not None
    name = f"{served.registry}/{release.image.removeprefix('ghcr.io/')}"
    pulled = buildah("pull", "--quiet", "--tls-verify=false", f"docker://{name}")
    try:
        assert pulled == release.image_id
    finally:
        buildah("rmi", name)
    # The manifest the registry serves is the archive's, byte for byte: a signature made over the
    # release's digest holds for what is pulled.
    archive = next((release.dist / "images").glob("*.oci.tar"))
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
    (manifest,) = index["manifests"]
    repository, _, tag = release.image.removeprefix("ghcr.io/").rpartition(":")
    request = urllib.request.Request(
        f"http://{served.registry}/v2/{repository}/manifests/{tag}",
        headers={"Accept": manifest["mediaType"]},
        method="HEAD",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Docker-Content-Digest"] == manifest["digest"]


def test_the_chart_pushed_at_start_is_pulled_back_by_helm(
    served: DevCluster,
    chart: Path,
    helm: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
) -> None:
    reference = f"oci://{served.registry}/apportion/charts/tiny"
    shown = helm("show", "chart", reference, "--version", CHART_VERSION, "--plain-http").stdout
    assert f"version: {CHART_VERSION}" in shown.splitlines()
    helm("pull", reference, "--version", CHART_VERSION, "--plain-http", "-d", str(tmp_path))
    assert (tmp_path / chart.name).read_bytes() == chart.read_bytes()


def test_pip_downloads_the_asked_version_from_the_index(
    served: DevCluster, release: Release, tmp_path: Path
) -> None:
    assert served.python_index is not None
    # Only the index: no find-links directory or index of this machine's pip configuration.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-cache-dir",
            "--no-deps",
            "--isolated",
            "--index-url",
            served.python_index,
            "-d",
            str(tmp_path),
            "apportion==1.0.0",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (downloaded,) = tmp_path.iterdir()
    expected = release.wheels["1.0.0"]
    assert downloaded.name == expected.name
    assert hashlib.sha256(downloaded.read_bytes()).digest() == (
        hashlib.sha256(expected.read_bytes()).digest()
    )


def test_maven_resolves_a_deployed_artifact_from_the_repository(
    served: DevCluster, release: Release, tmp_path: Path
) -> None:
    assert served.maven_repository is not None
    local = local_repository() / Path(*release.group.split("."))
    try:
        maven(
            "org.apache.maven.plugins:maven-dependency-plugin:get",
            f"-DremoteRepositories=apportion::default::{served.maven_repository}",
            f"-Dartifact={release.group}:tiny:{MAVEN_VERSION}",
            "-Dtransitive=false",
            cwd=tmp_path,
        )
        resolved = local / "tiny" / MAVEN_VERSION / f"tiny-{MAVEN_VERSION}.jar"
        assert resolved.read_bytes() == release.jar.read_bytes()
    finally:
        shutil.rmtree(local, ignore_errors=True)  # the group is this run's alone


def test_the_registry_addresses_are_printed_for_a_shell(served: DevCluster) -> None:
    printed = subprocess.run(
        [
            str(Path(sys.executable).with_name("apportion")),
            "dev-cluster",
            "registry",
            "--state-dir",
            str(served.state_dir),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert printed.splitlines() == [
        f"APPORTION_REGISTRY={served.registry}",
        f"APPORTION_PYTHON_INDEX={served.python_index}",
        f"APPORTION_MAVEN_REPOSITORY={served.maven_repository}",
    ]


def test_a_pod_runs_a_published_name_pulled_through_the_mirror(
    real_cluster: DevCluster, release: Release
) -> None:
    """containerd resolves `ghcr.io/apportion/registry-probe:<tag>` (a tag nothing imported)
    through the registry mirror it was configured with at start."""
    assert real_cluster.registry is not None, "the real-node cluster runs no registry"
    archive = next((release.dist / "images").glob("*.oci.tar"))
    push_image(archive, real_cluster.registry)
    namespace = f"registry-{secrets.token_hex(3)}"
    real_cluster.kubectl("create", "namespace", namespace)
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "namespace": namespace},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [{"name": "probe", "image": release.image}],
            },
        }
        real_cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))

        def phase() -> str | None:
            found: dict[str, Any] = json.loads(
                real_cluster.kubectl("get", "-n", namespace, "pod", "probe", "-o", "json").stdout
            )
            return found.get("status", {}).get("phase")

        wait_for(
            lambda: phase() in ("Running", "Succeeded"),
            timeout=90,
            message=f"the pod of {release.image} never ran",
        )
        events = json.loads(
            real_cluster.kubectl(
                "get", "events", "-n", namespace, "--field-selector=reason=Pulled", "-o", "json"
            ).stdout
        )["items"]
        messages = [e["message"] for e in events]
        assert any(
            m.startswith(f'Successfully pulled image "{release.image}"') for m in messages
        ), messages
    finally:
        real_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_flux_fetches_the_chart_as_an_oci_repository(
    served: DevCluster, chart: Path, tmp_path: Path
) -> None:
    """Flux's source-controller takes the chart from the registry over plain HTTP with
    `spec.insecure: true`, and stores the very archive that was pushed."""
    repository = {
        "apiVersion": "source.toolkit.fluxcd.io/v1",
        "kind": "OCIRepository",
        "metadata": {"name": "tiny", "namespace": "default"},
        "spec": {
            "url": f"oci://{served.registry}/apportion/charts/tiny",
            "ref": {"tag": CHART_VERSION},
            "interval": "10m",
            "insecure": True,
            "layerSelector": {
                "mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip",
                "operation": "copy",
            },
        },
    }
    with Flux.start(served, tmp_path / "flux") as flux:
        served.kubectl("apply", "-f", "-", input=json.dumps(repository))
        try:

            def artifact() -> dict[str, Any] | None:
                status = flux.get("OCIRepository", "default", "tiny").get("status", {})
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in status.get("conditions", [])
                )
                return status["artifact"] if ready else None

            stored = wait_for(artifact, timeout=60, message="the OCIRepository never got Ready")
            assert stored["revision"].startswith(f"{CHART_VERSION}@sha256:")
            with urllib.request.urlopen(stored["url"], timeout=10) as response:
                assert response.read() == chart.read_bytes()
        finally:
            # Its finalizer needs the controller, which stops with the block.
            served.kubectl("delete", "ocirepository", "tiny", "--timeout=60s", check=False)
