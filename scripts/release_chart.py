"""The release's Kubernetes artifacts, stamped with the release version from the tree's sources
(which keep their development default, 0.1.0) into dist/, never into the tree:

    python scripts/release_chart.py --version 0.1.0 --dist dist

- charts/apportion-<v>.tgz: `helm package` of charts/apportion, version and appVersion <v>,
  linted by `helm lint`. The chart in the tree reaches out of its directory through symlinks
  (crds/ and files/ point at crds/ and manifests/, which stay the one source); it is packaged
  from a staged copy with every link resolved, so the package holds only regular files and a
  link that would leave the chart cannot ship. Staging rather than generated copies in the tree:
  nothing to keep in sync or forget to regenerate, and the tree's chart still renders the same.
- install.yaml: `kubectl kustomize manifests/` (CRDs, namespace, operator, RBAC and admission
  policies) with the operator image's tag set to <v>, one file as cert-manager ships it.
- flux/apportion-manifests-<v>.tar.gz: install.yaml as the content of a Flux OCI artifact
  (a gzipped tar, mtime 0), published as `oci://ghcr.io/apportion/manifests:<v>` for an
  OCIRepository and a Kustomization to install the operator (docs/gitops.md).
- samples/*.yaml: manifests/samples with the demo image's tag set to <v>.
- krew/: scripts/krew.py's archive and a manifest whose uri is the archive on the GitHub release
  of v<v>.
"""

from __future__ import annotations

import argparse
import gzip
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from apportion_dev.devcluster import ensure_built
from apportion_dev.devcluster.tools import HELM, ensure_tool

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "apportion"
CRDS = REPO / "crds"
MANIFESTS = REPO / "manifests"
SAMPLES = MANIFESTS / "samples"
NAMESPACE = "apportion-system"
OPERATOR_IMAGE = "ghcr.io/apportion/apportion"
RELEASES = "https://github.com/apportion/apportion/releases/download"
# What install.yaml holds that has no namespace (everything else must be in NAMESPACE).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)
# A published image's reference in manifests/samples and kustomization.yaml, tag included.
IMAGE_TAG = re.compile(r"(ghcr\.io/apportion/apportion(?:-demo)?):[\w][\w.-]*")


class ReleaseError(Exception):
    pass


def stage_chart(work: Path) -> Path:
    """A copy of the chart with every symlink replaced by what it points to."""
    staged = work / CHART.name
    shutil.copytree(CHART, staged, symlinks=False)
    return staged


def archive_problems(tgz: Path, chart: str = CHART.name) -> list[str]:
    """What makes a chart package not self-contained: a member that is not a regular file or a
    directory (a link, a device) or whose path leaves the chart's directory."""
    problems = []
    with tarfile.open(tgz, "r:gz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not parts or parts[0] != chart or ".." in parts or Path(member.name).is_absolute():
                problems.append(f"{member.name}: outside {chart}/")
            if not (member.isfile() or member.isdir()):
                problems.append(f"{member.name}: not a regular file")
    return problems


def package_chart(version: str, dist: Path, helm: Path) -> Path:
    """`helm package` of the staged chart as version and appVersion <v>, linted as shipped."""
    out = dist / "charts"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="apportion-chart-") as work:
        staged = stage_chart(Path(work))
        versions = ("--version", version, "--app-version", version)
        run(helm, "package", str(staged), *versions, "--destination", str(out))
    tgz = out / f"{CHART.name}-{version}.tgz"
    run(helm, "lint", "--strict", str(tgz))
    problems = archive_problems(tgz)
    if problems:
        raise ReleaseError(f"{tgz} is not self-contained:\n" + "\n".join(problems))
    return tgz


def stamp_images(text: str, version: str) -> str:
    """Every published apportion image reference with the tag `version`."""
    return IMAGE_TAG.sub(rf"\g<1>:{version}", text)


def stamp_kustomization(text: str, version: str) -> str:
    return re.sub(r"(?m)^(\s+newTag:\s*).*$", rf"\g<1>{version}", text)


def render_install(version: str, kubectl: Path) -> str:
    """`kubectl kustomize manifests/` with the operator image's tag set to `version`, run on a
    staged copy (the kustomization reaches ../crds) so that the tree keeps its default."""
    with tempfile.TemporaryDirectory(prefix="apportion-install-") as work:
        shutil.copytree(CRDS, Path(work) / CRDS.name)
        staged = Path(work) / MANIFESTS.name
        shutil.copytree(MANIFESTS, staged)
        kustomization = staged / "kustomization.yaml"
        kustomization.write_text(stamp_kustomization(kustomization.read_text(), version))
        rendered = run(kubectl, "kustomize", str(staged))
    header = (
        f"# apportion {version}: the CRDs, the {NAMESPACE} namespace, the operator, its RBAC and\n"
        "# the admission policies, as `kubectl apply -k manifests/` installs them:\n"
        f"#   kubectl apply -f {RELEASES}/v{version}/install.yaml\n"
    )
    return header + rendered


def install_problems(objects: Iterable[dict[str, Any]], version: str) -> list[str]:
    """What install.yaml must hold: every CRD of crds/, the namespace, every namespaced object in
    it and no cluster-scoped one in any, and operator containers on the release's image."""
    problems = []
    kinds: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        kinds[kind, meta["name"]] = obj
        namespace = meta.get("namespace")
        if kind in CLUSTER_SCOPED and namespace is not None:
            problems.append(f"{kind}/{meta['name']} is cluster-scoped but names {namespace}")
        if kind not in CLUSTER_SCOPED and namespace != NAMESPACE:
            problems.append(f"{kind}/{meta['name']} is in {namespace!r}, not {NAMESPACE}")
    for crd in sorted(CRDS.glob("*.yaml")):
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        if ("CustomResourceDefinition", name) not in kinds:
            problems.append(f"no CustomResourceDefinition {name}")
    if ("Namespace", NAMESPACE) not in kinds:
        problems.append(f"no Namespace {NAMESPACE}")
    workloads = [obj for (kind, _), obj in kinds.items() if kind in {"Deployment", "StatefulSet"}]
    if not workloads:
        problems.append("no operator workload")
    for workload in workloads:
        for container in workload["spec"]["template"]["spec"]["containers"]:
            if container["image"] != f"{OPERATOR_IMAGE}:{version}":
                problems.append(f"{workload['metadata']['name']} runs {container['image']}")
    return problems


def write_install(version: str, dist: Path, kubectl: Path) -> Path:
    text = render_install(version, kubectl)
    problems = install_problems((d for d in yaml.safe_load_all(text) if d), version)
    if problems:
        raise ReleaseError("install.yaml is wrong:\n" + "\n".join(problems))
    path = dist / "install.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_flux_artifact(install: Path, dist: Path, version: str) -> Path:
    """install.yaml in a tar.gz as `flux push artifact` packs a directory: reproducible (no
    times, no owners), so that the published digest is the same for the same release."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = install.read_bytes()
        entry = tarfile.TarInfo(install.name)
        entry.size, entry.mode, entry.mtime = len(data), 0o644, 0
        tar.addfile(entry, io.BytesIO(data))
    path = dist / "flux" / f"apportion-manifests-{version}.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle, gzip.GzipFile(fileobj=handle, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return path


def write_samples(version: str, dist: Path) -> list[Path]:
    out = dist / "samples"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for sample in sorted(SAMPLES.glob("*.yaml")):
        path = out / sample.name
        path.write_text(stamp_images(sample.read_text(), version))
        written.append(path)
    return written


def write_krew(version: str, dist: Path) -> list[Path]:
    """scripts/krew.py's archive and manifest for v<version>, into dist/krew."""
    out = dist / "krew"
    manifest = out / "apportion.yaml"
    printed = run(
        Path(sys.executable),
        str(REPO / "scripts" / "krew.py"),
        *("--out", str(out), "--version", version, "--manifest", str(manifest)),
    )
    return [Path(printed.split()[0]), manifest]


def run(binary: Path, *args: str) -> str:
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"{binary.name} {args[0]} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def build(version: str, dist: Path, revision: str) -> list[Path]:
    """The chart, install.yaml (also as a Flux artifact), the samples and the krew archive into
    `dist`; the files written.
    (`revision` is the images' business: nothing here names a commit.)"""
    del revision
    helm = ensure_tool(HELM) / "helm"
    kubectl = ensure_built() / "kubectl"
    install = write_install(version, dist, kubectl)
    return [
        package_chart(version, dist, helm),
        install,
        write_flux_artifact(install, dist, version),
        *write_samples(version, dist),
        *write_krew(version, dist),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True)
    parser.add_argument("--dist", type=Path, default=REPO / "dist")
    parser.add_argument("--revision", default="")
    args = parser.parse_args(argv)
    for path in build(args.version, args.dist.resolve(), args.revision):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
