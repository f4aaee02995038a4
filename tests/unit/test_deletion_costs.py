"""The pods' deletion costs (`apportion.publishing.deletion_costs`): whatever order the sets
report in, once the patches are flushed every pod that a set sees carries the sum of what the
sets assign it, and what is remembered stays bounded by what is held.

The oracle is a dict of pods with their annotations, patched as the API server would (a patch
of a pod that is gone answers 404), and the sums of the sets' last reports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from lightkube import ApiError

from apportion.api.pods import DELETION_COST
from apportion.publishing import deletion_costs
from apportion.publishing.deletion_costs import DeletionCosts

NS = "ns"
PODS = [f"w-{i}" for i in range(4)]
SETS = ["PartitionSet/a", "ShardSet/b", "PartitionSet/c"]


class Gone(ApiError):
    def __init__(self) -> None:
        self.status = type("Status", (), {"code": 404})()


class Cluster:
    """Pods by uid (the uid is the name here) with their annotations, as a client patches them."""

    def __init__(self) -> None:
        self.annotations: dict[str, str | None] = dict.fromkeys(PODS)
        self.patches = 0

    async def patch(self, _kind: Any, name: str, body: Mapping[str, Any], **_: Any) -> None:
        self.patches += 1
        if name not in self.annotations:
            raise Gone()
        self.annotations[name] = body["metadata"]["annotations"][DELETION_COST]


@pytest.fixture(autouse=True)
def no_flush_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deletion_costs, "FLUSH_SECONDS", 0.0)


async def flushed(costs: DeletionCosts) -> None:
    while costs._task is not None:
        await costs._task


report = st.tuples(
    st.sampled_from(SETS),
    st.dictionaries(st.sampled_from(PODS), st.integers(0, 5)),  # what it holds
    st.sets(st.sampled_from(PODS), min_size=1),  # the pods it sees, besides those it holds
)
step = st.one_of(
    report,
    report,
    report,
    st.tuples(st.just("delete pod"), st.sampled_from(PODS)),
    st.tuples(st.just("delete set"), st.sampled_from(SETS)),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(step, max_size=20), last=report)
async def test_every_seen_pod_ends_up_carrying_the_sum_its_sets_assign(
    steps: list[Any], last: tuple[str, dict[str, int], set[str]]
) -> None:
    cluster = Cluster()
    costs = DeletionCosts(cluster)  # type: ignore[arg-type]
    reported: dict[str, dict[str, int]] = {}  # set → pod → units, as last reported
    seen_last: dict[str, set[str]] = {}
    for item in [*steps, last]:
        if item[0] == "delete pod":
            cluster.annotations.pop(item[1], None)
        elif item[0] == "delete set":
            reported.pop(item[1], None)
            seen_last.pop(item[1], None)
            costs.forget_set(NS, item[1])
        else:
            holder_key, holds, others = item
            live = {p for p in {*holds, *others} if p in cluster.annotations}
            holds = {p: n for p, n in holds.items() if p in live}
            costs.update(NS, holder_key, holds, {p: (p, cluster.annotations[p]) for p in live})
            reported[holder_key] = {p: n for p, n in holds.items() if n}
            seen_last[holder_key] = live
        await flushed(costs)
    # Pods some set saw in its last report: their annotation is the sum every set assigns.
    checked = set().union(*seen_last.values()) & cluster.annotations.keys()
    event(f"pods checked: {'none' if not checked else 'some'}")
    event(
        f"a pod carries a cost: {any(a not in (None, '0') for a in cluster.annotations.values())}"
    )
    for pod in checked:
        expected = sum(held.get(pod, 0) for held in reported.values())
        note(f"{pod}: {cluster.annotations[pod]} for {expected}")
        assert cluster.annotations[pod] == str(expected) or (
            expected == 0 and cluster.annotations[pod] is None
        )
    # Remembered: only pods some set holds.
    held = {p for units in reported.values() for p, n in units.items() if n}
    assert {uid for _, uid in costs._pods} <= held


async def test_a_cost_the_api_server_was_away_for_is_set_once_it_is_back() -> None:
    """A patch that finds no API server (restarting, restored from a backup) is tried again at
    the next flush, not lost with the flushing task."""
    import httpx2

    class Away(Cluster):
        def __init__(self, refusals: int) -> None:
            super().__init__()
            self.refusals = refusals

        async def patch(self, _kind: Any, name: str, body: Mapping[str, Any], **_: Any) -> None:
            if self.refusals:
                self.refusals -= 1
                raise httpx2.ConnectError("All connection attempts failed")
            await super().patch(_kind, name, body)

    cluster = Away(refusals=2)
    costs = DeletionCosts(cluster)  # type: ignore[arg-type]
    costs.update(NS, SETS[0], {"w-0": 3}, {"w-0": ("w-0", None)})
    await flushed(costs)
    assert cluster.annotations["w-0"] == "3"
    assert cluster.refusals == 0
