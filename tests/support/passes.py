"""What a placement pass decided, for tests that expect it to have decided something: a
PassResult's decision and new table are None when it decided nothing or wrote nothing, and a
test that has set up a change reads them through these (a None fails the test)."""

from __future__ import annotations

from apportion.api.assignment import AssignmentTable
from apportion.engine.handoff import HandoffDecision
from apportion.engine.set_pass import PassResult
from tests.support.present import present


def decided(result: PassResult) -> HandoffDecision:
    """The pass's decision (None only without members or a usable strategy)."""
    return present(result.decision, "the pass decided nothing")


def written(result: PassResult) -> AssignmentTable:
    """The table the pass wrote."""
    return present(result.new_table, "the pass wrote no table")
