"""The operator publishes what workers' acks say about failing releases: a Warning Event
`ReleaseFailing` once, `status.releasesFailing`, `Degraded` and the operator gauge; gone again
once the hand-off ends. The set's daemon with the API calls stood in for (the pass itself is
tested in test_unitset_pass.py)."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import REGISTRY

from apportion.api import PartitionSet
from apportion.api.assignment import Incarnation
from apportion.api.pods import WorkerPod
from apportion.api.unitset import MetricsSource
from apportion.controllers import telemetry
from apportion.controllers.own_tables import OwnTables
from apportion.controllers.runtime import Runtime
from apportion.controllers.unitsets import loop as loop_module
from apportion.engine.handoff import make_ack
from apportion.engine.set_pass import PassInput, initial_table, plan_pass
from tests.support.passes import decided, written

LABELS = {"kind": "PartitionSet", "namespace": "release-failing", "set": "demo"}
BODY = {
    "apiVersion": "apportion.dev/v1alpha1",
    "kind": "PartitionSet",
    "metadata": {"name": "demo", "namespace": "release-failing", "uid": "set-uid", "generation": 1},
    "spec": {
        "partitions": 8,
        "selector": {"matchLabels": {"app": "w"}},
        "rebalance": {"interval": "1s", "handoffTimeout": "30s"},
    },
}


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def post(self, set_ref: Any, type_: str, reason: str, action: str, note: str) -> None:
        self.posted.append((type_, reason, note))


class RecordingLoop(loop_module.SetLoop):
    """The set's loop with what its stand-ins recorded."""

    events: Events
    statuses: list[Any]


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> Any:
    events, statuses = Events(), []

    async def patch_status(client: Any, kind: str, ns: str, name: str, status: Any) -> None:
        statuses.append(status)

    monkeypatch.setattr(loop_module, "patch_status", patch_status)
    # The loop reads the runtime's client, events, own tables and bodies: a namespace of fakes
    # stands in for the kopf-side Runtime (no client: the API calls are replaced).
    runtime = cast(
        Runtime,
        SimpleNamespace(client=None, events=events, tables=OwnTables(), body=lambda key: None),
    )
    daemon = RecordingLoop(PartitionSet, BODY, logging.getLogger("test"), runtime)
    daemon.events, daemon.statuses = events, statuses
    yield daemon
    telemetry.forget_set(daemon.labels)


def gauge() -> float | None:
    return REGISTRY.get_sample_value("apportion_operator_releases_failing", LABELS)


async def test_a_failing_release_is_an_event_a_status_count_and_a_gauge(daemon: Any) -> None:
    spec = PartitionSet.from_raw(BODY).spec
    members = [WorkerPod(f"w-{i}", f"uid-w-{i}") for i in range(2)]
    placed = plan_pass(PassInput(spec, initial_table(daemon.set_ref, spec, 1), 1, members, 0.0))
    assert placed.new_table is not None
    members.append(WorkerPod("w-2", "uid-w-2"))
    moving = written(plan_pass(PassInput(spec, written(placed), 1, members, 1.0)))
    assert moving is not None
    stuck = sorted(u for u, r in moving.releasing().items() if moving.units[u].owner == "w-0")
    ack = make_ack(moving, Incarnation("w-0", "uid-w-0"), pending=stuck, failing={stuck[0]: "boom"})
    members[0] = replace(members[0], acks={daemon.set_ref.ack_annotation: ack.to_annotation()})
    daemon.published = moving

    for now in (2.0, 3.0):  # a second pass with the same news posts no second Event
        result = plan_pass(PassInput(spec, moving, 1, members, now))
        await daemon.report(result, members, now, MetricsSource.COUNTS)
    warnings = [
        (reason, note) for type_, reason, note in daemon.events.posted if type_ == "Warning"
    ]
    assert warnings == [
        (
            "ReleaseFailing",
            f"w-0 cannot release 1 unit(s) ({stuck[0]}): boom; "
            "retried until the release succeeds or handoffTimeout reassigns",
        )
    ]
    status = daemon.statuses[-1]
    assert status["releasesFailing"] == 1
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ReleaseFailing")
    assert gauge() == 1

    # The retry succeeded: the ack covers the release; nothing is failing any more.
    members[0] = replace(
        members[0],
        acks={
            daemon.set_ref.ack_annotation: make_ack(
                moving, Incarnation("w-0", "uid-w-0")
            ).to_annotation()
        },
    )
    done = plan_pass(PassInput(spec, moving, 1, members, 4.0))
    assert done.new_table is not None
    assert not decided(done).failing
    daemon.published = written(done)
    settled = plan_pass(PassInput(spec, written(done), 1, members, 5.0))
    await daemon.report(settled, members, 5.0, MetricsSource.COUNTS)
    assert daemon.statuses[-1]["releasesFailing"] == 0
    assert gauge() == 0
