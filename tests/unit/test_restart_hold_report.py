"""The operator says why units wait for a restarting pod and keeps the wait across its own
restart: an Event `HeldForRestart` once per hold, and `status.restartHolds` written before the
table that leaves the units unowned. The set's daemon with the API calls stood in for (the
decisions are tested in test_restarts.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from apportion.api import PartitionSet
from apportion.api.assignment import AssignmentTable
from apportion.api.pods import WorkerPod
from apportion.controllers import telemetry
from apportion.controllers.own_tables import OwnTables
from apportion.controllers.runtime import Runtime
from apportion.controllers.unitsets import loop as loop_module
from apportion.engine.set_loop import Gathered, prepare, run
from apportion.engine.set_pass import PassInput, initial_table, plan_pass
from apportion.engine.set_state import SetState
from apportion.publishing.configmaps import AssignmentStore

BODY = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "PartitionSet",
    "metadata": {"name": "demo", "namespace": "restarts", "uid": "set-uid", "generation": 1},
    "spec": {
        "partitions": 8,
        "workloadRef": {"kind": "StatefulSet", "name": "w"},
        "rebalance": {"interval": "1s", "handoffTimeout": "30s", "restartGrace": "20s"},
    },
}


class RecordingLoop(loop_module.SetLoop):
    """The set's loop with what its stand-ins recorded."""

    writes: list[tuple[str, Any]]
    posted: list[tuple[str, str, str]]


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Any:
    writes: list[tuple[str, Any]] = []
    posted: list[tuple[str, str, str]] = []

    async def patch_status(client: Any, kind: str, ns: str, name: str, status: Any) -> None:
        writes.append(("status", status))

    async def publish(table: AssignmentTable) -> None:
        writes.append(("table", table))

    def post(set_ref: Any, type_: str, reason: str, action: str, note: str) -> None:
        posted.append((type_, reason, note))

    monkeypatch.setattr(loop_module, "patch_status", patch_status)
    # The loop reads the runtime's client, events, own tables and bodies: a namespace of fakes
    # stands in for the kopf-side Runtime (no client: the API calls are replaced).
    runtime = cast(
        Runtime,
        SimpleNamespace(
            client=None,
            events=SimpleNamespace(post=post),
            tables=OwnTables(),
            body=lambda key: None,
        ),
    )
    daemon = RecordingLoop(PartitionSet, BODY, logging.getLogger("test"), runtime)
    # The loop publishes through its store and reads its size; this one records the tables.
    daemon.store = cast(AssignmentStore, SimpleNamespace(publish=publish, size=0))
    daemon.writes, daemon.posted = writes, posted
    yield daemon
    telemetry.forget_set(daemon.labels)


async def test_a_hold_is_announced_once_and_written_before_its_table(daemon: Any) -> None:
    spec = PartitionSet.from_raw(BODY).spec
    members = [WorkerPod(f"w-{i}", f"uid-w-{i}") for i in range(2)]
    first = PassInput(spec, initial_table(daemon.set_ref, spec, 1), 1, members, 0.0)
    placed = plan_pass(first).new_table
    assert placed is not None
    await daemon.write_table(placed)
    mine = {u for u, s in placed.units.items() if s.owner == "w-1"}

    alone = members[:1]
    for now in (1.0, 2.0):  # the second pass sees the same hold: no second Event
        gathered = Gathered(spec, daemon.published, 1, alone, alone, now, desired_members=2)
        outcome = run(gathered, prepare(gathered, daemon.state, None, None), daemon.state)
        daemon.announce_holds(outcome.new_holds, outcome.result.restart_grace)
        if outcome.result.new_table is not None:
            await daemon.write_table(outcome.result.new_table)

    assert [reason for _, reason, _ in daemon.posted] == ["HeldForRestart"]
    type_, _, note = daemon.posted[0]
    assert type_ == "Normal"
    assert f"{len(mine)} unit(s)" in note
    assert "w-1" in note
    kinds = [kind for kind, _ in daemon.writes]
    assert kinds[-2:] == ["status", "table"], "the hold goes into the status first"
    status = daemon.writes[-2][1]
    assert [row["pod"] for row in status["restartHolds"]] == ["w-1"]
    unowned = daemon.writes[-1][1]
    assert {u for u, s in unowned.units.items() if s.owner is None} == mine

    successor = SetState.from_status(status)
    assert successor.restart_holds["w-1"].units == frozenset(mine)
