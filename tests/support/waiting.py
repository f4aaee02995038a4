"""Polling until a condition holds, for fixtures and helpers that have no `wait_for` fixture at
hand (tests/e2e/conftest.py hands the same function out as the `wait_for` fixture)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None],
    timeout: float = 60.0,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Poll `condition()` every 0.2 s and return its first truthy value, or fail the test with
    `message` after `timeout` seconds. A callable `message` is called then, so that it tells
    the state at the deadline rather than the state when the wait began."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            told = message() if callable(message) else message
            pytest.fail(f"after {timeout:.0f}s: {told}")
        time.sleep(0.2)
