"""`present(value, what)`: an Optional a test expects to be set, as its non-None type. For the
lookups whose None means "not there" (a condition, a table, a release) where the test has just
made it be there: a None fails the test with `what`, and mypy knows the value is set.
`name_of(obj)`: the name of an object read from the API server, which always has one though
lightkube's models type it Optional."""

from __future__ import annotations

from typing import Protocol, TypeVar

from lightkube.models.meta_v1 import ObjectMeta

T = TypeVar("T")


def present(value: T | None, what: str) -> T:
    if value is None:
        raise AssertionError(f"{what}: None")
    return value


class _Resource(Protocol):
    @property
    def metadata(self) -> ObjectMeta | None: ...


def name_of(obj: _Resource) -> str:
    return present(present(obj.metadata, "metadata").name, "metadata.name")
