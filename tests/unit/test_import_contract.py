"""The package's import contracts are import-linter's (`[tool.importlinter]` in pyproject.toml,
the one statement of them): this runs them, and checks that they can fail, on a copy of the
package given an import they forbid."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = REPO / "pyproject.toml"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", "pyproject.toml"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_package_keeps_every_import_contract() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout


LAZY_ENGINE_IMPORT = (
    "\n\ndef _probe() -> None:\n    from apportion.engine import keys  # noqa: F401\n"
)
TYPE_CHECKING_IMPORT = (
    "\nfrom typing import TYPE_CHECKING\n\n"
    "if TYPE_CHECKING:\n    from apportion.engine import keys  # noqa: F401\n"
)
PUBLISHING_ON_MODELS = "Publishing writes what the controllers decided"


@pytest.mark.parametrize(
    ("appended", "broken"),
    [
        # inside a function: counts (it runs when the function does)
        pytest.param(LAZY_ENGINE_IMPORT, True, id="publishing-imports-engine-in-a-function"),
        # under `if TYPE_CHECKING:`: never runs, does not count
        pytest.param(TYPE_CHECKING_IMPORT, False, id="publishing-imports-engine-for-typing"),
    ],
)
def test_the_contracts_can_fail(tmp_path: Path, appended: str, broken: bool) -> None:
    """The same contracts on a copy of the package with one more import in publishing."""
    shutil.copytree(
        REPO / "operator" / "apportion",
        tmp_path / "apportion",
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    events = tmp_path / "apportion" / "publishing" / "events.py"
    events.write_text(events.read_text() + appended)
    result = lint_imports(tmp_path, pythonpath=tmp_path)
    # the copy, not the installed package, is what was analysed
    assert "Analyzed" in result.stdout, result.stdout + result.stderr
    verdict = next(line for line in result.stdout.splitlines() if PUBLISHING_ON_MODELS in line)
    assert verdict.endswith("BROKEN" if broken else "KEPT"), result.stdout
    assert (result.returncode != 0) is broken, result.stdout


def test_fencing_forbids_every_dependency_but_psycopg() -> None:
    """Fencing sits on the standard library and psycopg alone: its contract must name every
    other third-party package the project installs (a new dependency joins the list)."""
    config = tomllib.loads(PYPROJECT.read_text())
    project = config["project"]
    declared = [
        *project["dependencies"],
        *(
            d
            for name, deps in project["optional-dependencies"].items()
            if name != "dev"
            for d in deps
        ),
    ]
    distributions = {
        d.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip().lower()
        for d in declared
        if not d.startswith("apportion")
    }
    imported_as = {"pyyaml": "yaml", "prometheus-client": "prometheus_client", "psycopg": None}
    expected = {imported_as.get(d, d) for d in distributions} - {None}
    (fencing,) = (
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "forbidden" and c["source_modules"] == ["apportion.fencing"]
    )
    assert expected <= set(fencing["forbidden_modules"]), expected - set(
        fencing["forbidden_modules"]
    )
