"""Statuses judged by the real kstatus (sigs.k8s.io/cli-utils pkg/kstatus/status, built from
devtools/go/kstatus by `make tools`; the `kstatus_binary` fixture builds it where missing, it
never skips): what Flux's `wait`, `kubectl`-style waiters and Argo CD's generic health read."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CURRENT, IN_PROGRESS, FAILED = "Current", "InProgress", "Failed"


def kstatus(binary: Path, *objects: Mapping[str, Any]) -> list[dict[str, str]]:
    """One result per object: {"name", "kind", "status", "message"} (and "error" when kstatus
    could not read the object)."""
    text = "\n".join(json.dumps(obj) for obj in objects)
    done = subprocess.run(
        [str(binary), "-any-exit0"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def kstatus_of(binary: Path, obj: Mapping[str, Any]) -> tuple[str, str]:
    """The kstatus result of one object: (status, message)."""
    (result,) = kstatus(binary, obj)
    assert "error" not in result, result
    return result["status"], result["message"]


def statuses(binary: Path, objects: Sequence[Mapping[str, Any]]) -> list[str]:
    return [r["status"] for r in kstatus(binary, *objects)]
