"""The release's chart, install.yaml and images (scripts/release_chart.py, release_images.py),
built as `make release` builds them and checked with the real tools: helm (built from its Go
module) lints and renders the packaged chart, the dev-cluster's API server accepts install.yaml
in a server-side dry run, and buildah's own record and the oci-archive carry the OCI
annotations. The images are built in the real-node tier (buildah, root), on buildah's layer
cache, so that a run where nothing changed takes seconds per image."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripts import release_chart, release_images

from apportion_dev.devcluster import ensure_built
from apportion_dev.devcluster.realnode import images

REPO = Path(__file__).resolve().parents[2]
VERSION = (REPO / "VERSION").read_text().strip()
OTHER = "0.2.0-rc.1"  # a version the tree names nowhere: stamping must reach every place


@pytest.fixture(scope="module")
def chart(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return release_chart.package_chart(VERSION, tmp_path_factory.mktemp("dist"), helm_binary)


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kubectl = ensure_built() / "kubectl"
    return release_chart.write_install(VERSION, tmp_path_factory.mktemp("dist"), kubectl)


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_the_packaged_chart_holds_only_its_own_regular_files(chart: Path, helm) -> None:
    assert chart.name == f"apportion-{VERSION}.tgz"
    with tarfile.open(chart, "r:gz") as tar:
        members = tar.getmembers()
        assert members
        for member in members:
            assert member.isfile() or member.isdir(), member.name
            assert Path(member.name).parts[0] == "apportion", member.name
            assert ".." not in Path(member.name).parts, member.name
        names = {m.name for m in members}
        meta = yaml.safe_load(tar.extractfile("apportion/Chart.yaml").read())  # type: ignore[union-attr]
        shipped_crd = tar.extractfile("apportion/crds/shardsets.apportion.dev.yaml").read()  # type: ignore[union-attr]
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    assert shipped_crd == (REPO / "crds" / "shardsets.apportion.dev.yaml").read_bytes()
    for link in (p for p in release_chart.CHART.rglob("*") if p.is_symlink()):
        if link.is_file():
            assert f"apportion/{link.relative_to(release_chart.CHART)}" in names, link
    lint = helm("lint", str(chart))
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout


def test_the_packaged_chart_renders_the_versioned_image_and_every_crd(chart: Path, helm) -> None:
    rendered = documents(helm("template", "apportion", str(chart), "--include-crds").stdout)
    crds = {d["metadata"]["name"] for d in rendered if d["kind"] == "CustomResourceDefinition"}
    assert crds == {
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in (REPO / "crds").glob("*.yaml")
    }
    (operator,) = [d for d in rendered if d["kind"] == "StatefulSet"]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/apportion/apportion:{VERSION}"


def test_another_version_is_stamped_into_the_chart_and_install_yaml_not_the_tree(
    helm_binary: Path, tmp_path: Path
) -> None:
    tree = (REPO / "manifests" / "kustomization.yaml").read_text()
    tgz = release_chart.package_chart(OTHER, tmp_path, helm_binary)
    with tarfile.open(tgz, "r:gz") as tar:
        meta = yaml.safe_load(tar.extractfile("apportion/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["version"], meta["appVersion"]) == (OTHER, OTHER)
    install = release_chart.write_install(OTHER, tmp_path, ensure_built() / "kubectl")
    (operator,) = [d for d in documents(install.read_text()) if d["kind"] == "StatefulSet"]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"ghcr.io/apportion/apportion:{OTHER}"
    assert (REPO / "manifests" / "kustomization.yaml").read_text() == tree


def test_install_yaml_holds_what_it_must_and_the_api_server_accepts_it(
    install: Path, dev_cluster
) -> None:
    objects = documents(install.read_text())
    assert release_chart.install_problems(objects, VERSION) == []
    # The namespace must exist for a dry run of what goes into it (a real apply creates it
    # first: it is install.yaml's first object).
    assert objects[0]["kind"] == "Namespace"
    dev_cluster.kubectl("apply", "-f", str(REPO / "manifests" / "namespace.yaml"))
    result = dev_cluster.kubectl("apply", "--dry-run=server", "-f", str(install))
    applied = {line.split()[0] for line in result.stdout.splitlines()}
    assert len(applied) == len(objects), result.stdout
    assert {
        "customresourcedefinition.apiextensions.k8s.io/shardsets.apportion.dev",
        "statefulset.apps/apportion-operator",
        "validatingadmissionpolicy.admissionregistration.k8s.io/apportion-worker-writes",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/apportion-worker-writes",
    } <= applied


def archive_annotations(archive: Path) -> tuple[str, dict[str, str]]:
    """The ref name of an oci-archive's one image and its manifest's annotations."""
    with tarfile.open(archive) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        (entry,) = index["manifests"]
        digest = entry["digest"].replace(":", "/")
        manifest = json.load(tar.extractfile(f"blobs/{digest}"))  # type: ignore[arg-type]
    return entry["annotations"]["org.opencontainers.image.ref.name"], manifest["annotations"]


def packages(sbom: Path) -> dict[str, str]:
    """Each package the SBOM lists, with its version."""
    document = json.loads(sbom.read_text())
    assert document["bomFormat"] == "CycloneDX"
    return {c["name"].lower(): c.get("version", "") for c in document["components"]}


@pytest.mark.realnode  # buildah as root, beside no other image build (one per machine)
def test_the_images_carry_their_annotations_and_sboms_of_what_they_hold(tmp_path: Path) -> None:
    revision = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    written = release_images.build(VERSION, tmp_path, revision)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == sorted(
        [
            f"images/apportion-{VERSION}.oci.tar",
            f"sbom/apportion-{VERSION}.cdx.json",
            f"images/apportion-demo-{VERSION}.oci.tar",
            f"sbom/apportion-demo-{VERSION}.cdx.json",
        ]
    )
    for image in release_images.IMAGES:
        tag = image.tag(VERSION)
        recorded = images.buildah(
            "inspect", "--type", "image", "--format", "{{.ImageAnnotations}}", tag
        )
        ref, annotations = archive_annotations(image.archive(tmp_path, VERSION))
        assert ref == tag
        for name, value in {
            "version": VERSION,
            "revision": revision,
            "source": "https://github.com/apportion/apportion",
            "licenses": "Apache-2.0",
            "title": image.name,
        }.items():
            assert annotations[f"org.opencontainers.image.{name}"] == value, name
            assert f"org.opencontainers.image.{name}:{value}" in recorded, name
    operator = packages(release_images.OPERATOR.sbom(tmp_path, VERSION))
    demo = packages(release_images.DEMO.sbom(tmp_path, VERSION))
    assert {"apportion", "kopf"} <= operator.keys()
    # The product image holds no harness and no PostgreSQL driver; the demo image holds both.
    assert not {"apportion-devtools", "psycopg"} & operator.keys()
    assert {"apportion", "apportion-devtools", "psycopg"} <= demo.keys()
    # What the images installed knows its version (the build context must hold VERSION).
    assert operator["apportion"] == demo["apportion"] == demo["apportion-devtools"] == VERSION
