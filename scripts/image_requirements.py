"""The third-party requirements of the image's Python environment, one per line, read from the
pyproject files alone: the Dockerfile installs them in a layer of their own before it copies the
sources, so a build after a source change (every release, every stamped test release, every
`make image`) reuses them instead of downloading and installing them again.

    python3 image_requirements.py PYPROJECT EXTRAS [DEVTOOLS_PYPROJECT]

EXTRAS is the comma-separated list the Dockerfile installs the package with; the build system's
requirements come too, as the package is then built without isolation (no second download).
Requirements on apportion itself (devtools' on the product) are left out: the package is
installed from its sources afterwards. Stdlib only: it runs on the image's base interpreter.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

OWN = {"apportion", "apportion-devtools"}


def name_of(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    document = tomllib.loads(pyproject.read_text())
    project = document["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise SystemExit(f"{pyproject}: no extra {', '.join(unknown)}")
    listed = [
        *document.get("build-system", {}).get("requires", []),
        *project.get("dependencies", []),
        *(r for e in extras for r in optional[e]),
    ]
    return [r for r in listed if name_of(r) not in OWN]


def main(argv: list[str]) -> int:
    pyproject, extras = Path(argv[0]), [e for e in argv[1].split(",") if e]
    wanted = requirements(pyproject, extras)
    if len(argv) > 2:
        wanted += requirements(Path(argv[2]), [])
    print("\n".join(dict.fromkeys(wanted)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
