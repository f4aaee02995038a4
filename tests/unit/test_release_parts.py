"""scripts/release.py's pure parts: the release notes out of CHANGELOG.md, SHA256SUMS (checked
by coreutils' `sha256sum -c`, the tool a user checks a download with), the step selection and
the refusals that stop a release before it builds anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import release

rel = release.load()

CHANGELOG = """# Changelog

Intro.

## [Unreleased]

### Added

- Something to come.

## [1.2.0] - 2026-03-01

### Changed

- The second release.

## [1.1.0] - 2026-01-01

### Added

- The first release.

[Unreleased]: https://github.com/apportion/apportion/compare/v1.2.0...HEAD
[1.2.0]: https://github.com/apportion/apportion/compare/v1.1.0...v1.2.0
"""


def test_a_section_runs_to_the_next_version() -> None:
    assert rel.changelog_section(CHANGELOG, "1.2.0") == "### Changed\n\n- The second release.\n"


def test_the_last_section_stops_at_the_link_definitions() -> None:
    assert rel.changelog_section(CHANGELOG, "1.1.0") == "### Added\n\n- The first release.\n"


@pytest.mark.parametrize("version", ["1.3.0", "1.2", "2.0.0"])
def test_a_version_without_its_section_is_refused_saying_what_to_add(version: str) -> None:
    with pytest.raises(rel.ReleaseError, match=rf"no section for {version}: .*## \[{version}\]"):
        rel.changelog_section(CHANGELOG, version)


def test_an_empty_section_is_refused() -> None:
    with pytest.raises(rel.ReleaseError, match="empty"):
        rel.changelog_section("## [1.0.0] - 2026-01-01\n\n## [0.9.0]\n- x\n", "1.0.0")


def test_the_repository_changelog_has_the_keep_a_changelog_unreleased_section() -> None:
    text = (release.REPO / "CHANGELOG.md").read_text()
    assert "## [Unreleased]\n" in text
    assert "`VERSION`" in rel.changelog_section(text, "Unreleased")


def _dist(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    (dist / "python").mkdir(parents=True)
    (dist / "maven" / "dev" / "apportion").mkdir(parents=True)
    (dist / "RELEASE-NOTES.md").write_text("notes\n")
    (dist / "python" / "apportion-1.0.0.tar.gz").write_bytes(bytes(range(256)) * 3)
    (dist / "maven" / "dev" / "apportion" / "a b.pom").write_text("<project/>\n")
    (dist / "empty").write_bytes(b"")
    return dist


def test_sha256sums_passes_sha256sum_check_and_lists_every_file(tmp_path: Path) -> None:
    dist = _dist(tmp_path)
    (dist / rel.SUMS).write_text(rel.sha256sums(dist))
    checked = subprocess.run(
        ["sha256sum", "--strict", "-c", rel.SUMS],
        cwd=dist,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    files = ["RELEASE-NOTES.md", "empty", "maven/dev/apportion/a b.pom"]
    files.append("python/apportion-1.0.0.tar.gz")
    assert sorted(checked.stdout.splitlines()) == [f"{name}: OK" for name in files]
    # sha256sum's own output over the same files, as the oracle of the format
    own = subprocess.run(
        ["sha256sum", *files], cwd=dist, capture_output=True, text=True, check=True
    )
    assert (dist / rel.SUMS).read_text() == own.stdout


def test_a_changed_file_fails_the_check(tmp_path: Path) -> None:
    dist = _dist(tmp_path)
    (dist / rel.SUMS).write_text(rel.sha256sums(dist))
    (dist / "RELEASE-NOTES.md").write_text("notes, changed\n")
    checked = subprocess.run(
        ["sha256sum", "-c", rel.SUMS], cwd=dist, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 1
    assert "RELEASE-NOTES.md: FAILED" in checked.stdout


def test_steps_are_selected_by_name() -> None:
    assert rel.selected([], []) == list(rel.STEPS)
    assert rel.selected([], ["images", "chart"]) == ["notes", "python", "java"]
    assert rel.selected(["java"], []) == ["java"]
    with pytest.raises(rel.ReleaseError, match="no step imagez"):
        rel.selected([], ["imagez"])


def test_a_version_other_than_the_version_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = tmp_path / "dist"
    assert rel.main(["--version", "9.9.9", "--only", "notes", "--dist", str(dist)]) == 1
    assert f"VERSION says {rel.read_version()}" in capsys.readouterr().err
    assert not dist.exists()


def test_the_notes_step_writes_the_section_and_the_sums(tmp_path: Path) -> None:
    version = rel.read_version()
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text(f"# Changelog\n\n## [{version}] - 2026-11-28\n\n- Released.\n")
    dist = tmp_path / "dist"
    args = ["--version", version, "--only", "notes", "--dist", str(dist)]
    assert rel.main([*args, "--changelog", str(changelog)]) == 0
    assert (dist / "RELEASE-NOTES.md").read_text() == "- Released.\n"
    assert (dist / "SHA256SUMS").read_text().endswith("  RELEASE-NOTES.md\n")


def test_a_missing_section_fails_the_release_with_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## [Unreleased]\n\n- Soon.\n")
    args = ["--version", rel.read_version(), "--only", "notes", "--dist", str(tmp_path / "d")]
    assert rel.main([*args, "--changelog", str(changelog)]) == 1
    assert "CHANGELOG.md has no section for" in capsys.readouterr().err
