"""The Spin model of the hand-off protocol (models/handoff/handoff.pml, docs/handoff.md "How we
know"): every safety and liveness configuration explored in full with 0 errors, and every
mutant — the model with one rule of docs/handoff.md dropped — refuted by a counterexample: a
state that breaks a safety property, or for a liveness mutant a fair cycle, after the faults
stopped, in which a unit is never served. The hypothesis model (test_handoff_model.py) drives
the Python engine itself; this one covers every interleaving within small bounds. Under CI=true
a missing spin fails (conftest turns skips into errors)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from scripts.model_check import CHECKS, MUTANTS, Check, run

pytestmark = pytest.mark.skipif(
    shutil.which("spin") is None or shutil.which("cc") is None,
    reason="spin or cc missing (apt-get install spin; make native-deps)",
)


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_model_holds_in_every_state(check: Check, tmp_path: Path) -> None:
    outcome = run(check, tmp_path)
    assert outcome.errors == 0, outcome.output
    assert outcome.full, outcome.output
    assert outcome.states > 1000, outcome.output  # the model did explore something


@pytest.mark.parametrize("check", MUTANTS, ids=[c.name for c in MUTANTS])
def test_each_mutant_is_refuted(check: Check, tmp_path: Path) -> None:
    outcome = run(check, tmp_path)
    assert outcome.errors >= 1, f"{check.rule}: not refuted\n{outcome.output}"
    assert outcome.violated == check.violates, outcome.output
    assert list(tmp_path.glob("*.trail")), "a counterexample leaves a trail"
