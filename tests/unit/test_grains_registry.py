"""Strategies and filters from GrainType specs (flat and API forms) and from entry points."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from importlib.metadata import EntryPoint, EntryPoints
from typing import Any, Self

import pytest

from apportion.api.graintype import GrainStrategySpec
from apportion.api.graintype import PlacementFilter as PlacementFilterSpec
from apportion.api.placement_table import TableMember
from apportion.engine.grains import (
    BUILTIN_STRATEGIES,
    DEFAULT_GRAIN_STRATEGY,
    FILTER_ENTRY_POINTS,
    STRATEGY_ENTRY_POINTS,
    ActivationCountBasedPlacement,
    CandidateView,
    ConsistentHashBasedPlacement,
    GrainFilter,
    GrainSpecError,
    GrainStrategy,
    PlacementContext,
    PlacementTable,
    RequiredMatch,
    ResourceOptimizedPlacement,
    SiloRoleBasedPlacement,
    StatelessWorkerPlacement,
    Trace,
    grain_strategy_names,
    make_grain_strategy,
    registry,
)


def test_every_builtin_is_reachable_by_name() -> None:
    for name, cls in BUILTIN_STRATEGIES.items():
        spec: dict[str, Any] = {"name": name}
        assert type(make_grain_strategy(spec)) is cls
    assert type(make_grain_strategy({})).name == DEFAULT_GRAIN_STRATEGY == "ResourceOptimized"


def test_flat_options() -> None:
    count = make_grain_strategy({"name": "ActivationCountBased", "chooseOutOf": 3})
    assert isinstance(count, ActivationCountBasedPlacement)
    assert count.choose_out_of == 3
    worker = make_grain_strategy({"name": "StatelessWorker", "maxLocal": 6})
    assert isinstance(worker, StatelessWorkerPlacement)
    assert worker.max_local == 6
    role = make_grain_strategy({"name": "SiloRoleBased", "roleLabel": "tier", "role": "gpu"})
    assert isinstance(role, SiloRoleBasedPlacement)
    assert (role.role_label, role.role) == ("tier", "gpu")
    resource = make_grain_strategy(
        {
            "name": "ResourceOptimized",
            "weights": {"cpuUsage": 10, "activationCount": 90},
            "localSiloPreferenceMargin": 0,
        }
    )
    assert isinstance(resource, ResourceOptimizedPlacement)
    assert (resource.weights.cpu_usage, resource.weights.memory_usage) == (10, 20)
    assert resource.weights.activation_count == 90
    assert resource.local_preference_margin == 0
    ring = make_grain_strategy({"name": "ConsistentHashBased", "virtualNodes": 7})
    assert isinstance(ring, ConsistentHashBasedPlacement)
    assert ring.virtual_nodes == 7


def test_options_of_other_strategies_are_ignored() -> None:
    strategy = make_grain_strategy({"name": "Random", "chooseOutOf": 5, "maxLocal": 2})
    assert strategy.describe() == "Random"


def test_the_grain_type_api_form_is_accepted() -> None:
    api = GrainStrategySpec.model_validate(
        {
            "name": "ResourceOptimized",
            "resourceOptimized": {"cpuUsage": 70, "localSiloPreferenceMargin": 9},
        }
    ).model_dump(by_alias=True, mode="json")
    strategy = make_grain_strategy(api)
    assert isinstance(strategy, ResourceOptimizedPlacement)
    assert strategy.weights.cpu_usage == 70
    assert strategy.local_preference_margin == 9
    filters = [
        PlacementFilterSpec.model_validate({"type": "RequiredMatch", "keys": ["zone"]}).model_dump(
            by_alias=True, mode="json"
        )
    ]
    counted = make_grain_strategy(
        GrainStrategySpec.model_validate(
            {"name": "ActivationCountBased", "activationCountBased": {"chooseOutOf": 4}}
        ).model_dump(by_alias=True, mode="json"),
        filters,
    )
    assert counted.describe() == "ActivationCountBased(chooseOutOf=4)"
    assert isinstance(counted.filters[0], RequiredMatch)
    assert counted.filters[0].keys == ("zone",)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": "Nope"}, "no entry point 'Nope' in group 'apportion.grain_strategies'"),
        ({"name": "Custom"}, "Custom needs an entryPoint"),
        ({"name": "Random", "chooseOutof": 2}, r"unknown strategy options \['chooseOutof'\]"),
        ({"name": "ActivationCountBased", "chooseOutOf": 0}, "chooseOutOf must be an integer >= 1"),
        ({"name": "ActivationCountBased", "chooseOutOf": "2"}, "chooseOutOf must be an integer"),
        ({"name": "StatelessWorker", "maxLocal": -1}, "maxLocal must be an integer >= 1"),
        ({"name": "ResourceOptimized", "weights": {"cpu": 1}}, r"unknown weights \['cpu'\]"),
        ({"name": "ResourceOptimized", "weights": {"cpuUsage": 101}}, r"0\.\.100"),
        ({"name": "ResourceOptimized", "localSiloPreferenceMargin": 101}, r"0\.\.100"),
        ({"name": "ResourceOptimized", "weights": [1]}, "weights must be an object"),
        ({"name": "SiloRoleBased", "roleLabel": ""}, "roleLabel must be a non-empty"),
        ({"name": ""}, "non-empty string"),
        ({"name": "Random", "resourceOptimized": 3}, "must be an object"),
    ],
)
def test_bad_specs_fail_with_a_clear_message(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(GrainSpecError, match=message):
        make_grain_strategy(spec)


# --- Entry points --------------------------------------------------------------------------


class Sticky(GrainStrategy):
    """A plug-in: always the member named in its `parameters.member`."""

    name = "Sticky"

    def __init__(self, member: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.member = member

    @classmethod
    def from_spec(
        cls,
        spec: Mapping[str, Any],
        *,
        filters: Sequence[GrainFilter] = (),
        rng: random.Random | None = None,
    ) -> Self:
        return cls(spec["parameters"]["member"], filters=filters, rng=rng)

    def choose(
        self, view: CandidateView, grain_id: str, ctx: PlacementContext, trace: Trace | None
    ) -> str:
        if trace is not None:
            trace.note("sticky")
        return self.member if self.member in view.position else view.names[0]


class EvenOnly(GrainFilter):
    """A plug-in filter keeping members whose name ends in an even digit."""

    type_name = "EvenOnly"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Self:
        return cls()

    def apply(
        self, table: PlacementTable, candidates: tuple[int, ...], caller: Mapping[str, str]
    ) -> tuple[int, ...]:
        return tuple(i for i in candidates if int(table.names[i][-1]) % 2 == 0)


class NotAStrategy:
    pass


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = EntryPoints(
        [
            EntryPoint("Sticky", f"{__name__}:Sticky", STRATEGY_ENTRY_POINTS),
            EntryPoint("Broken", f"{__name__}:NotAStrategy", STRATEGY_ENTRY_POINTS),
            EntryPoint("EvenOnly", f"{__name__}:EvenOnly", FILTER_ENTRY_POINTS),
        ]
    )
    monkeypatch.setattr(registry, "entry_points", installed.select)


@pytest.mark.usefixtures("plugins")
def test_custom_strategies_and_filters_come_from_entry_points() -> None:
    table = PlacementTable(TableMember(name=f"w{i}") for i in range(5))
    api_form = {
        "name": "Custom",
        "custom": {"entryPoint": "Sticky", "parameters": {"member": "w3"}},
    }
    flat_form = {"name": "Sticky", "parameters": {"member": "w3"}}
    for spec in (api_form, flat_form):
        strategy = make_grain_strategy(spec, [{"type": "EvenOnly"}])
        strategy.update(table)
        assert strategy.place("g", PlacementContext()) == "w0"  # w3 filtered out
        assert strategy.explain("g", PlacementContext()).filters[0].removed == ("w1", "w3")
    assert grain_strategy_names()[-2:] == ("Broken", "Sticky")


@pytest.mark.usefixtures("plugins")
def test_an_entry_point_of_the_wrong_kind_is_rejected() -> None:
    with pytest.raises(GrainSpecError, match=r"'Broken'.*not a GrainStrategy subclass"):
        make_grain_strategy({"name": "Broken"})
    with pytest.raises(GrainSpecError, match=r"installed: \['EvenOnly'\]"):
        make_grain_strategy({"name": "Random"}, [{"type": "Missing"}])
