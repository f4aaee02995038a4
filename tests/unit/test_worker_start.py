"""A worker pod's start: the worker libraries load without the operator's pydantic models (most
of what importing them used to cost, 1 s or more of every restart on a busy node) and without
kopf. Checked in a fresh interpreter, by the modules it loaded, not by time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["apportion.worker", "apportion.kafka.__main__"])
def test_a_worker_library_loads_no_pydantic_and_no_kopf(module: str) -> None:
    probe = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.check_output([sys.executable, "-c", probe], text=True)))
    assert module in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("pydantic", "kopf")}


def test_the_api_package_still_gives_every_kind_on_first_use() -> None:
    probe = "import json, apportion.api as api; print(json.dumps(sorted(api.resource_kinds())))"
    kinds = json.loads(subprocess.check_output([sys.executable, "-c", probe], text=True))
    assert kinds == ["GrainType", "PartitionSet", "ShardSet"]
