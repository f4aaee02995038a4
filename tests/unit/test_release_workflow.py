"""The public release workflow (.github/workflows/release.yml), checked by actionlint (built from
its Go module, devtools/go/tools/actionlint), as GitHub would run it: on a tag v*, the same
`make release` as on a laptop, then each registry from the one dist/."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def lint(actionlint: Path, workflow: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(actionlint), "-no-color", "-oneline", str(workflow)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_actionlint_passes_the_release_workflow(actionlint: Path) -> None:
    checked = lint(actionlint, WORKFLOW)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_actionlint_fails_a_broken_variant(actionlint: Path, tmp_path: Path) -> None:
    """The same workflow with a publishing job waiting on a job that does not exist and an output
    nobody sets: actionlint must say both, or the test above proves nothing."""
    broken = WORKFLOW.read_text()
    broken = broken.replace("needs: [build, pypi, maven-central, ghcr]", "needs: [build, pypy]")
    broken = broken.replace("needs.build.outputs.version }}/", "needs.build.outputs.vesion }}/")
    workflow = tmp_path / ".github" / "workflows" / "release.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text(broken)
    checked = lint(actionlint, workflow)
    assert checked.returncode == 1
    assert '"pypy"' in checked.stdout
    assert '"vesion"' in checked.stdout


def test_a_tag_runs_make_release_and_every_registry_gets_dist() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow[True]["push"]["tags"] == ["v*"]  # YAML 1.1 reads `on` as true
    jobs = workflow["jobs"]
    runs = [step.get("run", "") for step in jobs["build"]["steps"]]
    assert any(run.startswith("make release VERSION=") for run in runs)
    for name in ("pypi", "maven-central", "ghcr", "github-release"):
        assert "build" in jobs[name]["needs"], name
    # Trusted publishing and keyless signing need the OIDC token; nothing else gets it.
    with_token = {name for name, job in jobs.items() if job.get("permissions", {}).get("id-token")}
    assert with_token == {"pypi", "ghcr"}
    assert workflow["permissions"] == {"contents": "read"}
