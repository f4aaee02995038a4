"""The one controller loop both kinds run (`apportion.controllers.runtime`): back-off on failures,
one immediate retry on a write conflict, wake-ups, deletion, and the shared rate limit on
retries (never on the first reaction to an event)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from apportion.controllers import runtime as runtime_module
from apportion.controllers.runtime import PassLimiter, backoff, run_loop
from apportion.controllers.wakeups import Wakeups
from apportion.publishing.client import ObjectGone
from apportion.publishing.configmaps import PublishConflict

KEY = "ShardSet/ns/s"


class Script:
    """A reconciler whose passes do what a list says: a number (seconds until the next pass is
    due), or an exception to raise. It records every call the loop makes."""

    def __init__(self, steps: list[Any], done: asyncio.Event) -> None:
        self.key = KEY
        self.labels = ("ShardSet", "ns", "s")
        self.outcome = "unchanged"
        self.logger: logging.Logger | logging.LoggerAdapter[Any] = logging.getLogger("test")
        self.steps, self.done = steps, done
        self.calls: list[str] = []
        self.retry_delays: list[float] = []

    async def reconcile(self) -> float | None:
        self.calls.append("pass")
        if not self.steps:
            self.done.set()
            return None
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return time.time() + step

    def forget(self) -> None:
        self.calls.append("forget")

    async def failed(self, error: BaseException, retry_in: float) -> None:
        self.retry_delays.append(retry_in)

    def finish(self, deleted: bool) -> None:
        self.calls.append(f"finish deleted={deleted}")


def fake_runtime(limiter: PassLimiter | None = None) -> Any:
    return SimpleNamespace(wakeups=Wakeups(), limiter=limiter or PassLimiter(), caches=lambda: ())


def drained(wait: float) -> PassLimiter:
    """A bucket that other objects' retries have emptied: the next token comes in `wait` s."""
    now = [0.0]
    limiter = PassLimiter(rate=1.0 / wait, burst=1, clock=lambda: now[0])
    limiter.delay()
    return limiter


async def turns() -> None:
    """Let the loop run as far as it can without time passing."""
    for _ in range(20):
        await asyncio.sleep(0)


def looping(runtime: Any, steps: list[Any]) -> tuple[Script, asyncio.Future[None]]:
    """A loop over `steps` that only the object's deletion ends."""
    never = asyncio.Event()
    script = Script(steps, never)
    return script, asyncio.ensure_future(run_loop(runtime, script, never))


async def deleted(runtime: Any, task: asyncio.Future[None]) -> None:
    """Delete the object; its loop ends."""
    runtime.wakeups.gone(KEY)
    await asyncio.wait_for(task, 5)


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "RETRY_SECONDS", 0.001)


def test_backoff_doubles_from_the_first_retry_up_to_its_cap() -> None:
    assert [backoff(n) for n in range(1, 5)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff(30) == 300.0


async def run_script(steps: list[Any]) -> Script:
    done = asyncio.Event()
    script = Script(steps, done)
    await asyncio.wait_for(run_loop(fake_runtime(), script, done), 10)
    return script


async def test_failures_back_off_doubling_and_a_success_resets_the_count(
    quick_retries: None,
) -> None:
    boom = RuntimeError("API server unreachable")
    script = await run_script([boom, boom, boom, 0.0, boom])
    assert script.retry_delays == [0.001, 0.002, 0.004, 0.001]


async def test_a_conflict_is_retried_at_once_and_rereads_then_backs_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[int] = []

    def recorded(failures: int) -> float:
        waits.append(failures)
        return 0.001

    monkeypatch.setattr(runtime_module, "backoff", recorded)
    conflict = PublishConflict("someone else wrote the table")
    script = await run_script([conflict, conflict, conflict, 0.0])
    assert waits == [1, 2]  # the first conflict is retried at once, the next ones back off
    # resync forget, then one forget per conflict; no failure is reported for a conflict
    assert script.calls.count("forget") == 4
    assert script.retry_delays == []
    assert script.calls[-1] == "finish deleted=False"


async def test_a_wakeup_runs_a_pass_before_the_pass_is_due_and_deletion_ends_the_loop() -> None:
    runtime = fake_runtime()
    script, task = looping(runtime, [3600.0, 3600.0])
    await turns()
    assert script.calls.count("pass") == 1  # due in an hour: it waits
    runtime.wakeups.notify(KEY)
    await turns()
    assert script.calls.count("pass") == 2
    await deleted(runtime, task)
    assert script.calls[-1] == "finish deleted=True"


def test_the_pass_limiter_lets_a_burst_through_then_paces_at_its_rate() -> None:
    now = [0.0]
    limiter = PassLimiter(rate=10.0, burst=3, clock=lambda: now[0])
    assert [limiter.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    # The bucket is empty: the 4th and 5th wait one and two tenths of a second.
    assert limiter.delay() == pytest.approx(0.1)
    assert limiter.delay() == pytest.approx(0.2)
    now[0] = 10.0  # refilled, never beyond the burst
    assert [limiter.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.delay() > 0


async def test_an_event_runs_a_pass_at_once_whatever_the_retry_bucket_holds() -> None:
    # client-go rate-limits requeues, not the first reaction to an event: one set's pod
    # deletion must not queue behind a thousand other sets' passes.
    runtime = fake_runtime(drained(wait=3600.0))
    script, task = looping(runtime, [3600.0, 3600.0, 3600.0])
    await turns()
    runtime.wakeups.notify(KEY)
    await turns()
    assert script.calls.count("pass") == 2
    await deleted(runtime, task)


async def test_a_retry_waits_for_the_shared_bucket_when_it_is_slower_than_the_backoff(
    quick_retries: None,
) -> None:
    runtime = fake_runtime(drained(wait=7.0))
    script, task = looping(runtime, [RuntimeError("API server unreachable")])
    await turns()
    # Back-off alone would retry after 1 ms; the bucket, emptied by others, has its next token
    # in 7 s.
    assert script.retry_delays == [pytest.approx(7.0)]
    assert script.calls.count("pass") == 1
    await deleted(runtime, task)


async def test_an_object_gone_mid_pass_is_no_failure_and_waits_for_its_deletion() -> None:
    runtime = fake_runtime()
    script, task = looping(runtime, [ObjectGone("ShardSet ns/s is gone"), 0.0])
    await turns()
    assert script.retry_delays == []  # no failure reported, no retry scheduled
    assert script.calls.count("pass") == 1
    await deleted(runtime, task)
    assert script.calls[-1] == "finish deleted=True"
