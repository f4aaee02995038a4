"""`scripts/release.py` for real, without the images and the chart (the image builds have tests
of their own): what it writes into dist/ is checked with the tools a user or a registry has, not
with the script's own code: `twine check`, `pip install` of the wheel with its extras into a fresh
virtualenv, `jar tf` of the sources and javadoc jars, the poms' elements Maven Central requires,
`sha256sum -c`, and the CycloneDX SBOMs' components."""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from tests.support import release

REPO = release.REPO
VERSION = (REPO / "VERSION").read_text().strip()
NOTES = "- The first release, as the test's own changelog says.\n"
JAVA = {
    "apportion-client": "dev/apportion/client/ConfigMapPayload",
    "apportion-pekko": "dev/apportion/pekko/ApportionSharding",
    "apportion-kafka": "dev/apportion/kafka/PartitionConsumer",
}
POM = "{http://maven.apache.org/POM/4.0.0}"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("release")
    changelog = root / "CHANGELOG.md"
    changelog.write_text(f"# Changelog\n\n## [{VERSION}] - 2026-11-28\n\n{NOTES}")
    out = root / "dist"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "release.py"),
            "--version",
            VERSION,
            "--skip",
            "images",
            "--skip",
            "chart",
            "--dist",
            str(out),
            "--changelog",
            str(changelog),
        ],
        check=True,
    )
    return out


def test_the_notes_are_the_changelog_section(dist: Path) -> None:
    assert (dist / "RELEASE-NOTES.md").read_text() == NOTES


def test_sha256sum_checks_every_file(dist: Path) -> None:
    checked = subprocess.run(
        ["sha256sum", "--strict", "-c", "SHA256SUMS"],
        cwd=dist,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listed = {line.rsplit(": ", 1)[0] for line in checked.stdout.splitlines()}
    files = {p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file()}
    assert listed == files - {"SHA256SUMS"}


def test_the_python_distributions_pass_twine_check(dist: Path) -> None:
    built = sorted(p.name for p in (dist / "python").iterdir())
    assert [n for n in built if n.endswith(".tar.gz")] == [
        f"apportion-{VERSION}.tar.gz",
        f"apportion_devtools-{VERSION}.tar.gz",
    ]
    assert len([n for n in built if n.endswith(".whl")]) == 2
    twine = [sys.executable, "-m", "twine", "check", "--strict"]
    subprocess.run([*twine, *sorted((dist / "python").iterdir())], check=True)


def test_the_wheel_installs_with_its_extras_and_knows_its_version(
    dist: Path, tmp_path: Path
) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    (wheel,) = (dist / "python").glob(f"apportion-{VERSION}-*.whl")
    pip = [str(env / "bin" / "pip"), "install", "--quiet"]
    subprocess.run([*pip, f"apportion[kafka,postgres] @ {wheel.as_uri()}"], check=True)
    probe = (
        "import aiokafka, psycopg, apportion; from apportion.engine import keys;"
        "print(apportion.__version__, keys.NATIVE)"
    )
    shown = subprocess.run(
        [str(env / "bin" / "python"), "-c", probe],
        cwd=tmp_path,  # not the checkout: the installed package, not operator/apportion
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.split() == [VERSION, "True"]  # the key kernel came with the wheel


def test_the_kernel_wheel_is_manylinux_and_needs_no_library_beside_libc(dist: Path) -> None:
    """The only tag PyPI takes for a Linux wheel with compiled code, and what auditwheel (the
    check PyPA's own builds run) says of the wheel: nothing to graft, no versioned symbol beyond
    the policy."""
    (wheel,) = (dist / "python").glob(f"apportion-{VERSION}-*.whl")
    python_tag, abi, platforms = wheel.name.removesuffix(".whl").split("-")[2:]
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert (python_tag, abi) == (here, here)
    assert all(p.startswith("manylinux") for p in platforms.split(".")), platforms
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "requires no external shared libraries" in shown.stdout, shown.stdout


@pytest.mark.parametrize("artifact", sorted(JAVA))
def test_each_java_artifact_has_sources_javadoc_and_a_central_pom(
    dist: Path, artifact: str
) -> None:
    where = dist / "maven" / "dev" / "apportion" / artifact / VERSION
    stem = where / f"{artifact}-{VERSION}"
    sources = _jar_listing(stem.with_name(stem.name + "-sources.jar"))
    assert f"{JAVA[artifact]}.java" in sources
    javadoc = _jar_listing(stem.with_name(stem.name + "-javadoc.jar"))
    assert "index.html" in javadoc
    assert f"{JAVA[artifact]}.html" in javadoc
    assert f"{JAVA[artifact]}.class" in _jar_listing(stem.with_name(stem.name + ".jar"))

    text = stem.with_name(stem.name + ".pom").read_text()
    assert "${" not in text  # the flattened pom: no property left for a consumer to resolve
    pom = ET.fromstring(text)
    assert pom.find(f"{POM}parent") is None
    for element in ("groupId", "artifactId", "version", "name", "description", "url"):
        assert (pom.findtext(f"{POM}{element}") or "").strip(), element
    assert pom.findtext(f"{POM}version") == VERSION
    assert pom.findtext(f"{POM}artifactId") == artifact
    assert pom.findtext(f"{POM}licenses/{POM}license/{POM}name") == "Apache-2.0"
    assert pom.findtext(f"{POM}developers/{POM}developer/{POM}name")
    for element in ("connection", "developerConnection", "url"):
        assert pom.findtext(f"{POM}scm/{POM}{element}"), element
    versions = [d.findtext(f"{POM}version") for d in pom.iter(f"{POM}dependency")]
    assert all(versions), versions
    assert not any(v and v.endswith("-SNAPSHOT") for v in versions)


def _jar_listing(jar: Path) -> set[str]:
    listed = subprocess.run(["jar", "tf", str(jar)], capture_output=True, text=True, check=True)
    return set(listed.stdout.split())


@pytest.mark.parametrize(
    ("artifact", "dependency"),
    [
        ("apportion", "pydantic"),
        ("apportion-devtools", "apportion"),
        ("apportion-client", "kubernetes-client"),
        ("apportion-pekko", "pekko-cluster-sharding-typed_2.13"),
        ("apportion-kafka", "kafka-clients"),
    ],
)
def test_each_distribution_has_a_cyclonedx_sbom_of_its_dependencies(
    dist: Path, artifact: str, dependency: str
) -> None:
    text = (dist / "sbom" / f"{artifact}-{VERSION}.cdx.json").read_text()
    sbom = json.loads(text)
    assert sbom["bomFormat"] == "CycloneDX"
    # the CycloneDX JSON schema of the document's own spec version
    schema = JsonStrictValidator(SchemaVersion.from_version(sbom["specVersion"]))
    assert schema.validate_str(text) is None
    assert sbom["metadata"]["component"]["name"] == artifact
    assert sbom["metadata"]["component"]["version"] == VERSION
    names = {component["name"] for component in sbom["components"]}
    assert dependency in names
