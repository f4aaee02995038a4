"""Strategies and filters by name, from GrainType specs (camelCase JSON form).

Built-ins are registered here; custom ones come from entry points: group
`apportion.grain_strategies` (a `GrainStrategy` subclass) and group `apportion.grain_filters`
(a `GrainFilter` subclass). Unit-allocation strategies use a separate group of the allocation
engine, so a grain strategy and a unit strategy may share a name.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from .base import GrainStrategy
from .basic import (
    PreferLocalPlacement,
    RandomPlacement,
    SiloRoleBasedPlacement,
    StatelessWorkerPlacement,
)
from .errors import GrainSpecError
from .filters import BUILTIN_FILTERS, GrainFilter
from .hashing import ConsistentHashBasedPlacement, HashBasedPlacement
from .load import ActivationCountBasedPlacement, ResourceOptimizedPlacement

STRATEGY_ENTRY_POINTS = "apportion.grain_strategies"
FILTER_ENTRY_POINTS = "apportion.grain_filters"

DEFAULT_GRAIN_STRATEGY = ResourceOptimizedPlacement.name
"""Orleans' default since 9.2; used when a spec names no strategy."""

BUILTIN_STRATEGIES: Mapping[str, type[GrainStrategy]] = {
    cls.name: cls
    for cls in (
        RandomPlacement,
        PreferLocalPlacement,
        HashBasedPlacement,
        ConsistentHashBasedPlacement,
        ActivationCountBasedPlacement,
        StatelessWorkerPlacement,
        SiloRoleBasedPlacement,
        ResourceOptimizedPlacement,
    )
}

CUSTOM_STRATEGY = "Custom"
"""The name under which the GrainType API selects a strategy by `entryPoint` alone."""

_OPTIONS: Mapping[str, frozenset[str]] = {
    "Random": frozenset(),
    "PreferLocal": frozenset(),
    "HashBased": frozenset(),
    "ConsistentHashBased": frozenset({"virtualNodes"}),
    "ActivationCountBased": frozenset({"chooseOutOf"}),
    "StatelessWorker": frozenset({"maxLocal"}),
    "SiloRoleBased": frozenset({"roleLabel", "role"}),
    "ResourceOptimized": frozenset(
        {"weights", "localSiloPreferenceMargin", "optimisticAccounting"}
    ),
}
_SPEC_KEYS = frozenset({"name", "entryPoint"}).union(*_OPTIONS.values())

# The GrainType API keeps each strategy's options in a block of its own; the flat form puts
# them beside `name`. ResourceOptimized's weights sit flat in its block.
_OPTION_BLOCKS = frozenset(
    {
        "activationCountBased",
        "statelessWorker",
        "siloRoleBased",
        "resourceOptimized",
        "consistentHashBased",
        "custom",
    }
)
_WEIGHT_KEYS = frozenset(
    {"cpuUsage", "memoryUsage", "availableMemory", "maxAvailableMemory", "activationCount"}
)


def _flatten(spec: Mapping[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in spec.items() if k not in _OPTION_BLOCKS and v is not None}
    for block in _OPTION_BLOCKS:
        options = spec.get(block)
        if options is None:
            continue
        if not isinstance(options, Mapping):
            raise GrainSpecError(f"strategy.{block} must be an object, got {options!r}")
        for key, value in options.items():
            if value is None:
                continue
            if block == "resourceOptimized" and key in _WEIGHT_KEYS:
                flat["weights"] = {**flat.get("weights", {}), key: value}
            else:
                flat[key] = value
    return flat


def _load_entry_point(group: str, name: str, base: type) -> Any:
    found = entry_points(group=group, name=name)
    if not found:
        available = sorted(ep.name for ep in entry_points(group=group))
        raise GrainSpecError(
            f"no entry point {name!r} in group {group!r} (installed: {available or 'none'})"
        )
    loaded = next(iter(found)).load()
    if not (isinstance(loaded, type) and issubclass(loaded, base)):
        raise GrainSpecError(
            f"entry point {name!r} in group {group!r} is not a {base.__name__} subclass"
        )
    return loaded


def make_grain_filter(spec: Mapping[str, Any]) -> GrainFilter:
    """`{type: RequiredMatch|PreferredMatch|<entry point>, keys: [...], minCandidates: n}`."""
    if not isinstance(spec, Mapping):
        raise GrainSpecError(f"a filter must be an object, got {spec!r}")
    type_name = spec.get("type")
    if not isinstance(type_name, str) or not type_name:
        raise GrainSpecError(f"filter needs a `type`, got {dict(spec)!r}")
    cls = BUILTIN_FILTERS.get(type_name) or _load_entry_point(
        FILTER_ENTRY_POINTS, type_name, GrainFilter
    )
    return cls.from_spec(spec)


def make_grain_filters(specs: Sequence[Mapping[str, Any]]) -> tuple[GrainFilter, ...]:
    """Filters in the order given, which is the order they run in."""
    return tuple(make_grain_filter(spec) for spec in specs)


def make_grain_strategy(
    spec: Mapping[str, Any],
    filters: Sequence[Mapping[str, Any]] = (),
    *,
    rng: random.Random | None = None,
) -> GrainStrategy:
    """Build a strategy from a GrainType strategy spec and its filter specs.

    The flat form is `{name, chooseOutOf, maxLocal, roleLabel, role, virtualNodes,
    weights{cpuUsage, memoryUsage, availableMemory, maxAvailableMemory, activationCount},
    localSiloPreferenceMargin, optimisticAccounting, entryPoint}`; the GrainType API form, with
    options in blocks (`activationCountBased{chooseOutOf}`, `resourceOptimized{cpuUsage, ...,
    localSiloPreferenceMargin, optimisticAccounting}`, `custom{entryPoint, parameters}`, ...), is
    accepted as well.
    Options of other strategies are ignored (a schema may default them); unknown keys are
    errors, except for custom strategies, which get the whole flattened spec. `Custom`, a name
    that is not built-in, or an `entryPoint` selects an entry point of
    `apportion.grain_strategies` (`entryPoint` defaults to `name`)."""
    if not isinstance(spec, Mapping):
        raise GrainSpecError(f"a strategy spec must be an object, got {spec!r}")
    spec = _flatten(spec)
    name = spec.get("name", DEFAULT_GRAIN_STRATEGY)
    entry_point = spec.get("entryPoint")
    if not isinstance(name, str) or not name:
        raise GrainSpecError(f"strategy name must be a non-empty string, got {name!r}")
    if name == CUSTOM_STRATEGY and entry_point is None:
        raise GrainSpecError("strategy Custom needs an entryPoint")
    built_filters = make_grain_filters(filters)
    cls = BUILTIN_STRATEGIES.get(name)
    if cls is None or entry_point is not None:
        target = entry_point if entry_point is not None else name
        if not isinstance(target, str) or not target:
            raise GrainSpecError(f"entryPoint must be a non-empty string, got {target!r}")
        custom: type[GrainStrategy] = _load_entry_point(
            STRATEGY_ENTRY_POINTS, target, GrainStrategy
        )
        return custom.from_spec(spec, filters=built_filters, rng=rng)
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise GrainSpecError(f"unknown strategy options {sorted(unknown)} for {name}")
    options = {key: value for key, value in spec.items() if key in _OPTIONS[name]}
    return cls.from_spec(options, filters=built_filters, rng=rng)


def grain_strategy_names() -> tuple[str, ...]:
    """Built-in names, then installed entry points."""
    installed = entry_points(group=STRATEGY_ENTRY_POINTS)
    custom = sorted(ep.name for ep in installed if ep.name not in BUILTIN_STRATEGIES)
    return (*BUILTIN_STRATEGIES, *custom)
