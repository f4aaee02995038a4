"""The pure parts of the release's Kubernetes artifacts and images (scripts/release_chart.py,
scripts/release_images.py, scripts/krew.py): the staged chart holds no link, a package that would
leave its directory is refused, install.yaml's checks catch each thing they check, and the
version is stamped into copies wherever the tree names its development default.
tests/e2e/test_release_artifacts.py runs them with the real helm, kubectl and buildah."""

from __future__ import annotations

import copy
import io
import os
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from scripts import krew, release_chart, release_images

REPO = Path(__file__).resolve().parents[2]
VERSION = "9.8.7"


def tree_files(root: Path) -> dict[str, bytes]:
    """Every file under root by relative path, through links, as helm reads a chart."""
    files = {}
    for directory, _, names in os.walk(root, followlinks=True):
        for name in names:
            path = Path(directory, name)
            files[str(path.relative_to(root))] = path.read_bytes()
    return files


def test_the_staged_chart_is_the_trees_with_every_link_resolved(tmp_path: Path) -> None:
    chart = release_chart.CHART
    links = [p for p in chart.rglob("*") if p.is_symlink()]
    assert links, "the tree's chart has no link: this test checks nothing"
    staged = release_chart.stage_chart(tmp_path)
    assert not [p for p in staged.rglob("*") if p.is_symlink()]
    assert tree_files(staged) == tree_files(chart)
    assert (staged / "crds" / "shardsets.apportion.dev.yaml").read_bytes() == (
        REPO / "crds" / "shardsets.apportion.dev.yaml"
    ).read_bytes()


def tgz(tmp_path: Path, *members: tarfile.TarInfo) -> Path:
    path = tmp_path / "chart.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            data = b"x" if member.isfile() else b""
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data else None)
    return path


def entry(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, target
    return member


def test_a_package_of_regular_files_in_the_chart_directory_is_self_contained(
    tmp_path: Path,
) -> None:
    archive = tgz(tmp_path, entry("apportion/Chart.yaml"), entry("apportion/crds/a.yaml"))
    assert release_chart.archive_problems(archive) == []


@pytest.mark.parametrize(
    "member",
    [
        entry("apportion/crds/a.yaml", tarfile.SYMTYPE, "../../../crds/a.yaml"),
        entry("apportion/files/b.yaml", tarfile.LNKTYPE, "apportion/Chart.yaml"),
        entry("apportion/../outside.yaml"),
        entry("other/Chart.yaml"),
        entry("/etc/passwd"),
    ],
    ids=["symlink", "hard-link", "dot-dot", "other-directory", "absolute"],
)
def test_a_package_with_a_link_or_a_path_out_of_the_chart_is_refused(
    tmp_path: Path, member: tarfile.TarInfo
) -> None:
    archive = tgz(tmp_path, entry("apportion/Chart.yaml"), member)
    problems = release_chart.archive_problems(archive)
    assert len(problems) == 1, problems
    assert problems[0].startswith(member.name)


def install_objects() -> list[dict[str, Any]]:
    """What install.yaml holds in small: every CRD of crds/, the namespace, the operator and a
    namespaced and a cluster-scoped object of its RBAC and policies."""
    ns = release_chart.NAMESPACE
    crds = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "crds").glob("*.yaml"))]
    operator = {
        "kind": "StatefulSet",
        "metadata": {"name": "apportion-operator", "namespace": ns},
        "spec": {"template": {"spec": {"containers": [{"image": f"{image()}:{VERSION}"}]}}},
    }
    return [
        {"kind": "Namespace", "metadata": {"name": ns}},
        *crds,
        {"kind": "Role", "metadata": {"name": "leader", "namespace": ns}},
        {"kind": "ClusterRole", "metadata": {"name": "apportion-operator"}},
        {"kind": "ValidatingAdmissionPolicy", "metadata": {"name": "apportion-worker-writes"}},
        operator,
    ]


def image() -> str:
    return "ghcr.io/apportion/apportion"


def test_install_objects_as_they_should_be_pass() -> None:
    assert release_chart.install_problems(install_objects(), VERSION) == []


def without_crd(objects: list[dict[str, Any]]) -> None:
    objects[:] = [o for o in objects if o["metadata"]["name"] != "shardsets.apportion.dev"]


def old_image(objects: list[dict[str, Any]]) -> None:
    objects[-1]["spec"]["template"]["spec"]["containers"][0]["image"] = f"{image()}:0.1.0"


def role_without_namespace(objects: list[dict[str, Any]]) -> None:
    del next(o for o in objects if o["kind"] == "Role")["metadata"]["namespace"]


def namespaced_policy(objects: list[dict[str, Any]]) -> None:
    policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy")
    policy["metadata"]["namespace"] = release_chart.NAMESPACE


def without_namespace(objects: list[dict[str, Any]]) -> None:
    objects[:] = [o for o in objects if o["kind"] != "Namespace"]


def without_operator(objects: list[dict[str, Any]]) -> None:
    objects[:] = [o for o in objects if o["kind"] != "StatefulSet"]


@pytest.mark.parametrize(
    "breakage",
    [
        without_crd,
        old_image,
        role_without_namespace,
        namespaced_policy,
        without_namespace,
        without_operator,
    ],
)
def test_install_objects_with_one_thing_wrong_are_refused(breakage: Any) -> None:
    objects = copy.deepcopy(install_objects())
    breakage(objects)
    assert len(release_chart.install_problems(objects, VERSION)) == 1


def images_of(text: str) -> list[str]:
    found = []
    for document in yaml.safe_load_all(text):
        spec = (document or {}).get("spec", {}).get("template", {}).get("spec", {})
        found += [c["image"] for c in spec.get("containers", [])]
    return found


def test_every_sample_is_stamped_with_the_release_version_and_the_tree_keeps_its_own() -> None:
    samples = sorted(release_chart.SAMPLES.glob("*.yaml"))
    assert samples
    for sample in samples:
        before = sample.read_text()
        stamped = images_of(release_chart.stamp_images(before, VERSION))
        assert stamped, sample.name
        assert [i.rsplit(":", 1)[0] for i in stamped] == [
            i.rsplit(":", 1)[0] for i in images_of(before)
        ]
        assert {i.rsplit(":", 1)[1] for i in stamped} == {VERSION}, sample.name
        assert sample.read_text() == before


def test_the_kustomization_is_stamped_with_the_release_version_and_nothing_else() -> None:
    text = (REPO / "manifests" / "kustomization.yaml").read_text()
    before, after = (
        yaml.safe_load(text),
        yaml.safe_load(release_chart.stamp_kustomization(text, VERSION)),
    )
    (image,) = after["images"]
    assert image["newTag"] == VERSION
    before["images"][0]["newTag"] = VERSION
    assert after == before


def test_the_release_krew_manifest_names_the_archive_on_the_github_release_of_its_version() -> None:
    manifest = yaml.safe_load(
        krew.stamp_manifest(krew.MANIFEST.read_text(), f"v{VERSION}", "ab" * 32)
    )
    (platform,) = manifest["spec"]["platforms"]
    assert manifest["spec"]["version"] == f"v{VERSION}"
    assert platform["uri"] == (
        "https://github.com/apportion/apportion/releases/download/"
        f"v{VERSION}/kubectl-apportion-v{VERSION}.tar.gz"
    )
    assert platform["sha256"] == "ab" * 32


def test_each_image_carries_the_oci_annotations_a_registry_shows() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    for image in release_images.IMAGES:
        annotations = release_images.oci_annotations(image, VERSION, "c0ffee", created)
        prefix = "org.opencontainers.image."
        assert {
            name: annotations[prefix + name]
            for name in ("version", "revision", "source", "licenses", "title", "created")
        } == {
            "version": VERSION,
            "revision": "c0ffee",
            "source": "https://github.com/apportion/apportion",
            "licenses": "Apache-2.0",
            "title": image.name,
            "created": "2026-01-02T03:04:05Z",
        }
        assert annotations[prefix + "description"]
    assert [i.tag(VERSION) for i in release_images.IMAGES] == [
        f"ghcr.io/apportion/apportion:{VERSION}",
        f"ghcr.io/apportion/apportion-demo:{VERSION}",
    ]


def test_the_product_image_holds_no_harness_and_the_demo_image_is_the_real_nodes() -> None:
    from apportion_dev.devcluster.realnode import images

    assert (release_images.OPERATOR.extras, release_images.OPERATOR.devtools) == (
        "operator",
        False,
    )
    assert (release_images.DEMO.extras, release_images.DEMO.devtools) == (images.EXTRAS, True)


def test_every_place_the_tree_names_its_development_version_names_the_version_file() -> None:
    """The release stamps these into dist/; in the tree they stay one development default, the
    VERSION file's, so that none drifts from the others unnoticed."""
    version = (REPO / "VERSION").read_text().strip()
    chart = yaml.safe_load((release_chart.CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (version, version)
    (image,) = yaml.safe_load((REPO / "manifests" / "kustomization.yaml").read_text())["images"]
    assert image["newTag"] == version
    for sample in sorted(release_chart.SAMPLES.glob("*.yaml")):
        tags = {i.rsplit(":", 1)[1] for i in images_of(sample.read_text())}
        assert tags == {version}, sample.name


def test_the_flux_artifact_holds_install_yaml_alone_and_is_reproducible(tmp_path: Path) -> None:
    install = tmp_path / "install.yaml"
    install.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: apportion-system\n")
    first = release_chart.write_flux_artifact(install, tmp_path / "a", "1.2.3")
    second = release_chart.write_flux_artifact(install, tmp_path / "b", "1.2.3")
    assert first.name == "apportion-manifests-1.2.3.tar.gz"
    assert first.read_bytes() == second.read_bytes()  # the same release, the same digest
    with tarfile.open(first, "r:gz") as archive:
        (member,) = archive.getmembers()
        assert (member.name, member.mtime, member.uid, member.uname) == ("install.yaml", 0, 0, "")
        extracted = archive.extractfile(member)
        assert extracted is not None
        assert extracted.read() == install.read_bytes()
