"""The operator's long-lived objects leave the cyclic collector's walks (controllers.heap)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from typing import Any

import pytest

from apportion.controllers.heap import freeze_long_lived


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def walked(obj: Any) -> bool:
    """Whether a collection of the oldest generation would visit `obj`."""
    return any(o is obj for generation in range(3) for o in gc.get_objects(generation))


async def test_what_survives_a_period_is_frozen_and_nothing_after_the_task_ends(
    unfrozen: None,
) -> None:
    cached = {"pod": ["as the caches hold it"]}
    assert walked(cached)
    freezing = asyncio.ensure_future(freeze_long_lived(period=0.05))
    await asyncio.sleep(0.08)
    assert not walked(cached), "alive at the period's end: frozen"
    freezing.cancel()
    await asyncio.gather(freezing, return_exceptions=True)
    later = {"pod": ["created after the task ended"]}
    await asyncio.sleep(0.08)
    assert walked(later)
