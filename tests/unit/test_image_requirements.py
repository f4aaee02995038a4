"""The Dockerfile's dependency layer (scripts/image_requirements.py) lists what the installed
distributions' own metadata requires: a requirement it missed would be installed nowhere (the
sources go in with --no-deps; the build's `pip check` is the last guard)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from scripts import image_requirements

REPO = Path(__file__).resolve().parents[2]
OWN = {"apportion", "apportion-devtools"}


def required_by_metadata(distribution: str, extras: tuple[str, ...]) -> set[str]:
    """The names setuptools wrote into the distribution's Requires-Dist for these extras."""
    names: set[str] = set()
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras):
            names.add(canonicalize_name(requirement.name))
    return names - OWN


def build_system() -> set[str]:
    return {canonicalize_name(name) for name in ("setuptools", "wheel")}


@pytest.mark.parametrize(
    ("extras", "devtools"), [(("operator",), False), (("operator", "postgres"), True)]
)
def test_the_layer_installs_what_the_distributions_require(
    extras: tuple[str, ...], devtools: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(REPO / "pyproject.toml"), ",".join(extras)]
    if devtools:
        argv.append(str(REPO / "devtools" / "pyproject.toml"))
    assert image_requirements.main(argv) == 0
    listed = {
        canonicalize_name(Requirement(line).name) for line in capsys.readouterr().out.splitlines()
    }
    expected = required_by_metadata("apportion", extras)
    if devtools:
        expected |= required_by_metadata("apportion-devtools", ())
    assert listed == expected | build_system()


def test_an_extra_the_project_lacks_is_an_error() -> None:
    with pytest.raises(SystemExit, match="no extra operatr"):
        image_requirements.main([str(REPO / "pyproject.toml"), "operatr"])
