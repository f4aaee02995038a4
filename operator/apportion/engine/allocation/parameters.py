"""The typed parameters of the built-in strategies: what `from_spec` builds from a set's spec
and what `from_options` builds from a plan snapshot's mapping, so each is parsed once."""

from __future__ import annotations

from dataclasses import dataclass

from apportion.api.unitset import IMBALANCE_TOLERANCES

TOLERANCES = IMBALANCE_TOLERANCES
"""Imbalance tolerance per strategy name, as the API documents them."""


@dataclass(frozen=True, slots=True)
class BalancedParameters:
    """``tolerance``: no rebalancing while every member's load is within this fraction of the
    mean; ``hysteresis``: when acting, aim at ``tolerance x hysteresis`` so that measurement
    noise does not bring the next plan straight back; ``max_moves`` / ``max_moved_load_percent``:
    churn budget per plan for optional moves (units of gone, not-ready or draining members move
    regardless); ``topology_key`` + ``max_skew``: unit counts per domain (e.g. zone) differ by at
    most ``max_skew``."""

    tolerance: float = TOLERANCES["Default"]
    hysteresis: float = 0.2
    max_moves: int | None = None
    max_moved_load_percent: float | None = None
    topology_key: str | None = None
    max_skew: int = 1

    @property
    def aim(self) -> float:
        return self.tolerance * self.hysteresis


@dataclass(frozen=True, slots=True)
class LeastShardsParameters:
    """Akka's ``rebalance-absolute-limit`` (default 20, Akka.NET's and Akka's recommendation)
    and ``rebalance-relative-limit`` (default 0.1)."""

    absolute_limit: int = 20
    relative_limit: float = 0.1


@dataclass(frozen=True, slots=True)
class ConsistentHashingParameters:
    virtual_nodes: int = 10
    rebalance_limit: int = 0
