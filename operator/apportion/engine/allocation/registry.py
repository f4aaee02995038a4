"""Strategies by name: the built-in ones and custom ones from Python entry points.

A custom allocation strategy is published by a distribution under the entry-point group
``apportion.allocation_strategies`` (grain placement strategies use
``apportion.grain_strategies``):

    [project.entry-points."apportion.allocation_strategies"]
    MyStrategy = "my_package.module:make"

``make(spec)`` receives the whole specification mapping (``name`` and options) and returns an
object with ``plan(request: AllocationRequest) -> Plan``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, Final

from apportion.engine.allocation.balanced import Balanced
from apportion.engine.allocation.consistent_hashing import ConsistentHashing
from apportion.engine.allocation.external import External
from apportion.engine.allocation.least_shards import LeastShards
from apportion.engine.allocation.model import AllocationError, AllocationStrategy

ENTRY_POINT_GROUP: Final = "apportion.allocation_strategies"
DEFAULT_STRATEGY: Final = "Balanced"

BUILTIN: Final[Mapping[str, Callable[[Mapping[str, Any]], AllocationStrategy]]] = {
    "Balanced": Balanced.from_options,
    "LeastShards": LeastShards.from_options,
    "ConsistentHashing": ConsistentHashing.from_options,
    "External": lambda spec: External.from_options(spec, make_strategy),
}


def strategy_names() -> list[str]:
    """Built-in strategy names, then installed custom ones."""
    custom = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return [*BUILTIN, *(name for name in custom if name not in BUILTIN)]


def make_strategy(spec: Mapping[str, Any]) -> AllocationStrategy:
    """The strategy ``spec["name"]`` configured with the rest of ``spec``.

    Raises :class:`AllocationError` for an unknown name or bad options.
    """
    if not isinstance(spec, Mapping):
        raise AllocationError(f"strategy must be an object with a name, got {spec!r}")
    name = spec.get("name", DEFAULT_STRATEGY)
    if not isinstance(name, str):
        raise AllocationError(f"strategy name must be a string, got {name!r}")
    factory = BUILTIN.get(name)
    if factory is None:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            known = ", ".join(strategy_names())
            raise AllocationError(f"unknown allocation strategy {name!r} (known: {known})")
        try:
            factory = found[0].load()
        except Exception as exc:  # a broken plug-in must not crash the caller
            raise AllocationError(f"strategy {name!r} failed to load: {exc}") from exc
    strategy = factory(spec)
    if not isinstance(strategy, AllocationStrategy):
        raise AllocationError(f"strategy {name!r} has no plan(request) method")
    return strategy
