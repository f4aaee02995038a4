"""`present(value, what)`: an Optional a test expects to be set, as its non-None type. For the
lookups whose None means "not there" (a condition, a table, a release) where the test has just
made it be there: a None fails the test with `what`, and mypy knows the value is set."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None, what: str) -> T:
    if value is None:
        raise AssertionError(f"{what}: None")
    return value
