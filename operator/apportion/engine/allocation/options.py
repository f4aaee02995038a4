"""Reading a strategy's options from its specification mapping, with clear errors."""

from __future__ import annotations

import math
from collections.abc import Mapping, Set
from typing import Any

from apportion.engine.allocation.model import AllocationError


class Options:
    """The options of strategy ``strategy`` (the spec without ``name``); every getter checks
    type and range, and :meth:`done` rejects keys nobody asked for (typos)."""

    def __init__(self, strategy: str, spec: Mapping[str, Any]) -> None:
        self.strategy = strategy
        self._spec = {k: v for k, v in spec.items() if k != "name"}
        self._read: set[str] = set()

    def _get(self, key: str) -> Any:
        self._read.add(key)
        return self._spec.get(key)

    def error(self, message: str) -> AllocationError:
        return AllocationError(f"strategy {self.strategy}: {message}")

    def integer(self, key: str, default: int | None, minimum: int = 0) -> int | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(f"{key} must be an integer >= {minimum}, got {value!r}")
        return value

    def number(
        self, key: str, default: float | None, minimum: float = 0.0, maximum: float = math.inf
    ) -> float | None:
        value = self._get(key)
        if value is None:
            return default
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not minimum <= value <= maximum
        ):
            raise self.error(f"{key} must be a number in [{minimum}, {maximum}], got {value!r}")
        return float(value)

    def text(self, key: str, default: str | None) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            raise self.error(f"{key} must be a non-empty string, got {value!r}")
        return value

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.error(f"{key} must be an object, got {value!r}")
        return value

    def raw(self, key: str) -> Any:
        return self._get(key)

    def done(self, also_allowed: Set[str] = frozenset()) -> None:
        unknown = sorted(set(self._spec) - self._read - also_allowed)
        if unknown:
            raise self.error(f"unknown option(s) {', '.join(unknown)}")
