"""pytest imports test modules by their basename (rootdir-relative "prepend" mode): two test files
of one name in different folders stop the whole run at collection, as tests/unit/test_kstatus.py
beside tests/e2e/test_kstatus.py once did."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_name_of_its_own() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" not in path.parts:
            where[path.name].append(str(path.relative_to(TESTS)))
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"test modules named alike: {twice}"
