"""The operator's metrics module: per-member series follow membership, a set's series go with
the set, API failures get bounded reasons, and the leader gauge follows kopf's peering log."""

from __future__ import annotations

import asyncio

import httpx2
from lightkube import ApiError
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from apportion.controllers import telemetry
from apportion.controllers.runtime import Runtime

SET = ("PartitionSet", "telemetry-test", "demo")


def samples(name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Samples of `name` in the exposition as a scraper parses it, by sorted labels."""
    text = generate_latest(REGISTRY).decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels.get("namespace") in (None, SET[1])
    }


def member_key(member: str) -> tuple[tuple[str, str], ...]:
    labels = {"kind": SET[0], "namespace": SET[1], "set": SET[2], "member": member}
    return tuple(sorted(labels.items()))


def test_member_series_follow_membership_and_go_with_the_set() -> None:
    telemetry.record_members(SET, {"w-0": 3, "w-1": 5}, {"w-0": 1.5, "w-1": 2.5})
    assert samples("apportion_operator_member_units") == {
        member_key("w-0"): 3,
        member_key("w-1"): 5,
    }
    assert samples("apportion_operator_member_load") == {
        member_key("w-0"): 1.5,
        member_key("w-1"): 2.5,
    }
    # w-0 left; loads no longer known (the set balances unit counts now)
    telemetry.record_members(SET, {"w-1": 8}, None)
    assert samples("apportion_operator_member_units") == {member_key("w-1"): 8}
    assert samples("apportion_operator_member_load") == {}

    telemetry.PASSES.labels(*SET, "published").inc()
    telemetry.TABLE_EPOCH.labels(*SET).set(7)
    assert samples("apportion_operator_passes_total")
    telemetry.forget_set(SET)
    for name in (
        "apportion_operator_member_units",
        "apportion_operator_passes_total",
        "apportion_operator_table_epoch",
    ):
        assert samples(name) == {}, name


def test_api_failures_have_bounded_reasons() -> None:
    forbidden = ApiError(
        response=httpx2.Response(
            403,
            json={"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"},
            request=httpx2.Request("PUT", "https://api/x"),
        )
    )
    assert telemetry.error_reason(forbidden) == "Forbidden"
    assert telemetry.error_reason(httpx2.ConnectError("refused")) == "Unreachable"
    assert telemetry.error_reason(ValueError("a bug, not the API")) is None


async def test_the_leader_gauge_follows_the_runtime_leading() -> None:
    runtime = Runtime(*([None] * 9))  # type: ignore[arg-type]
    runtime.stop_loops = lambda grace=10.0: asyncio.sleep(0)  # type: ignore[method-assign]
    leading = asyncio.ensure_future(runtime.lead())
    await asyncio.sleep(0)
    assert samples("apportion_operator_leader") == {(): 1}
    assert runtime.leading
    leading.cancel()
    await asyncio.gather(leading, return_exceptions=True)
    assert samples("apportion_operator_leader") == {(): 0}
    assert not runtime.leading
