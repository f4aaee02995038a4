"""Balanced with measured loads: minimise the largest load / capacity, with few moves.

1. Units without a live owner go largest first to the least loaded member (LPT, Graham 1969).
2. Hot units — a unit whose load alone exceeds the mean the other members will carry — each get a
   member to themselves (water-filling from the largest unit down); that member sheds everything
   else, and the plan reports the hottest unit with a suggested split.
3. Nothing more moves while every member is within the imbalance tolerance of the mean (Dicer's
   tolerance presets). Otherwise each member outside it is brought to within ``tolerance x
   hysteresis`` — aiming well below the trigger, so noise does not bring the next plan back:
   overloaded members pick the fewest units that close their excess; the units are packed onto
   the least loaded members, exactly by a bounded depth-first search in small cases, else greedily
   (neediest underloaded member, best fit, or a chain when a unit fits no room); underloaded
   members then take units already on the move (free), else from the most loaded members, with
   swaps where single moves cannot fit (greedy best-fit with swaps, as Slicer/Dicer-style
   balancers); moves that turn out needless are undone. A churn budget bounds the optional moves.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from apportion.engine.allocation.model import HotUnit, Plan, PlanQuality
from apportion.engine.allocation.parameters import BalancedParameters
from apportion.engine.allocation.plan_builder import (
    Origin,
    PlanBuilder,
    State,
    count_ratio,
    domains_of,
    target_members,
)

_EPS = 1e-9
_CANDIDATES = 4
"""Counterparts tried (least / most loaded first) before a member is left as it is."""
_EXACT_ITEMS = 40
_EXACT_RECEIVERS = 40
_EXACT_NODES = 4_000
"""Small packings are searched exactly (depth-first, this many nodes at most) before greedy."""


@dataclass(slots=True)
class _Movable:
    """A member's movable units, ascending by load."""

    xs: list[float] = field(default_factory=list)
    units: list[str] = field(default_factory=list)

    def pick(self, need: float, bound: float) -> int | None:
        """The smallest unit of load ≥ ``need`` and ≤ ``bound``; else the largest ≤ ``bound``."""
        j = bisect_left(self.xs, need)
        if j < len(self.xs) and self.xs[j] <= bound:
            return j
        j = bisect_right(self.xs, bound) - 1
        return j if j >= 0 and self.xs[j] > 0 else None

    def take(self, j: int) -> tuple[float, str]:
        return self.xs.pop(j), self.units.pop(j)

    def put(self, x: float, unit: str) -> None:
        j = bisect_right(self.xs, x)
        self.xs.insert(j, x)
        self.units.insert(j, unit)

    def remove(self, x: float, unit: str) -> bool:
        j = bisect_left(self.xs, x)
        while j < len(self.xs) and self.xs[j] == x:
            if self.units[j] == unit:
                del self.xs[j], self.units[j]
                return True
            j += 1
        return False


def _swap(give: _Movable, take: _Movable, need: float, bound: float) -> tuple[int, int] | None:
    """Units ``a`` of ``give`` and ``b`` of ``take`` whose exchange moves a net load in
    ``(0, bound]`` from give to take: the smallest net ≥ ``need`` if any, else the largest."""
    best: tuple[bool, float, int, int] | None = None
    ys = take.xs
    for ja, xa in enumerate(give.xs):
        jb = bisect_left(ys, xa - bound)  # largest net transfer within the bound
        if jb < len(ys) and ys[jb] < xa:
            candidates = [jb]
            jc = bisect_right(ys, xa - need) - 1  # smallest net transfer that closes the gap
            if jc >= jb:
                candidates.append(jc)
            for j in candidates:
                net = xa - ys[j]
                key = (net >= need, -net if net >= need else net, ja, j)
                if best is None or key[:2] > best[:2]:
                    best = key
    return None if best is None else (best[2], best[3])


class _Spread:
    """Unit counts per topology domain; a move may not push their spread past ``max_skew``
    (or past the current spread when that is already wider)."""

    def __init__(self, domain: dict[int, str], counts: dict[str, int], max_skew: int) -> None:
        self.domain = domain
        self.counts = counts
        self.max_skew = max_skew

    def _skew(self) -> int:
        return max(self.counts.values()) - min(self.counts.values())

    def allows(self, source: int | None, target: int) -> bool:
        a, b = self.domain.get(source) if source is not None else None, self.domain[target]
        if a == b:
            return True
        before = self._skew()
        self.shift(a, b)
        after = self._skew()
        self.shift(b, a)
        return after <= max(self.max_skew, before)

    def shift(self, a: str | None, b: str | None) -> None:
        if a is not None:
            self.counts[a] -= 1
        if b is not None:
            self.counts[b] += 1

    def moved(self, source: int | None, target: int) -> None:
        self.shift(self.domain.get(source) if source is not None else None, self.domain[target])


class _LazyHeap:
    """Members ordered by a key that changes as units move (min first); an entry is refreshed
    when its member's stamp shows it is stale."""

    def __init__(self, key: Callable[[int], float], members: Iterable[int], stamp: list[int]):
        self.key = key
        self.stamp = stamp
        self.heap = [(key(i), i, stamp[i]) for i in members]
        heapq.heapify(self.heap)

    def tops(self, k: int, exclude: int = -1) -> list[int]:
        """Up to ``k`` members from the top, skipping ``exclude``; the heap keeps them."""
        found: list[tuple[float, int, int]] = []
        skipped: list[tuple[float, int, int]] = []
        heap = self.heap
        while heap and len(found) < k:
            entry = heapq.heappop(heap)
            i = entry[1]
            if entry[2] != self.stamp[i]:
                heapq.heappush(heap, (self.key(i), i, self.stamp[i]))
            elif i == exclude:
                skipped.append(entry)
            else:
                found.append(entry)
        for entry in found + skipped:
            heapq.heappush(heap, entry)
        return [entry[1] for entry in found]


class _Planner:
    def __init__(self, state: State, options: BalancedParameters) -> None:
        self.state = state
        self.options = options
        self.builder = PlanBuilder(state)
        self.reasons: list[str] = []
        members = state.members
        self.cap = [m.capacity for m in members]
        self.loads = state.request.loads or {}
        # A unit not measured yet is assumed to carry the mean measured load.
        self.default = math.fsum(self.loads.values()) / len(self.loads) if self.loads else 1.0
        self.units = [list(h) for h in state.held]
        get, default = self.loads.get, self.default
        self.xs = [[get(u, default) for u in h] for h in state.held]
        self.load = [math.fsum(x) for x in self.xs]
        self.initial = list(self.load)
        self.total_load = math.fsum(self.load) + math.fsum(
            self.load_of(u) for u, _ in state.homeless
        )
        self.targets, why = target_members(state)
        if why:
            self.reasons.append(why)
        if state.dropped:
            self.reasons.append(f"{state.dropped} assigned unit(s) not in units: dropped")
        self.is_target = [False] * len(members)
        for i in self.targets:
            self.is_target[i] = True
        self.pools: dict[int, _Movable] = {}
        # A unit moves at most once per plan (undo aside): arrivals are not movable again, which
        # rules out ping-pong and keeps chains finite.
        self.settled: set[str] = set()
        # Units that arrived in this plan, per member: moving one on costs no extra move.
        self.arrived: dict[int, _Movable] = {}
        self.hi = self.lo = 0.0
        self.hot: dict[int, tuple[str, float]] = {}
        self.stamp = [0] * len(members)
        self.moves_left = math.inf if options.max_moves is None else options.max_moves
        percent = options.max_moved_load_percent
        self.load_left = math.inf if percent is None else self.total_load * percent / 100
        self.budget_hit = False
        self.moved_load = 0.0
        domains = domains_of(state, self.targets, options.topology_key)
        self.spread: _Spread | None = None
        if domains is not None:
            counts: dict[str, int] = dict.fromkeys(domains, 0)
            for i, d in zip(self.targets, domains, strict=True):
                counts[d] += len(self.units[i])
            self.spread = _Spread(
                dict(zip(self.targets, domains, strict=True)), counts, options.max_skew
            )

    # -- bookkeeping ---------------------------------------------------------------------------

    def load_of(self, unit: str) -> float:
        return self.loads.get(unit, self.default)

    def util(self, i: int) -> float:
        return self.load[i] / self.cap[i]

    def pool(self, i: int) -> _Movable:
        pool = self.pools.get(i)
        if pool is None:
            hot_unit = self.hot.get(i, (None, 0.0))[0]
            pairs = sorted(
                (x, u)
                for x, u in zip(self.xs[i], self.units[i], strict=True)
                if u not in self.state.in_progress and u != hot_unit and u not in self.settled
            )
            pool = _Movable([x for x, _ in pairs], [u for _, u in pairs])
            self.pools[i] = pool
        return pool

    def _arrive(self, i: int, x: float, unit: str) -> None:
        self.settled.add(unit)
        if self.hot.get(i, (None,))[0] != unit:
            self.arrived.setdefault(i, _Movable()).put(x, unit)
        if i not in self.pools:
            self.units[i].append(unit)
            self.xs[i].append(x)

    def allowed(self, source: int | None, target: int) -> bool:
        return self.spread is None or self.spread.allows(source, target)

    def transfer(self, x: float, unit: str, source: Origin, target: int) -> None:
        """Books a move of ``unit`` (load ``x``) that is already out of its source's pool."""
        self.builder.move(unit, source, target)
        if isinstance(source, int):
            passing = self.arrived.get(source)
            if passing is not None:
                passing.remove(x, unit)
            self.load[source] -= x
            self.stamp[source] += 1
        self.load[target] += x
        self.stamp[target] += 1
        self._arrive(target, x, unit)
        if self.spread is not None:
            self.spread.moved(source if isinstance(source, int) else None, target)

    def spend(self, moves: int, load: float) -> bool:
        """Takes ``moves`` / ``load`` from the churn budget; False (and stop) if it is spent.
        The round's first move always fits the load budget: a unit heavier than the whole
        budget would otherwise never move, and its member would stay overloaded for good."""
        first = self.moved_load == 0.0
        if moves > self.moves_left or (load > self.load_left + _EPS and not first):
            self.budget_hit = True
            return False
        self.moves_left -= moves
        self.load_left -= load
        self.moved_load += load
        return True

    # -- phases --------------------------------------------------------------------------------

    def place_homeless(self) -> None:
        """Units of gone / not-ready / draining members and new units: LPT onto the targets."""
        state = self.state
        pending: list[tuple[float, str, Origin]] = [
            (self.load_of(u), u, origin) for u, origin in state.homeless
        ]
        for i, held in enumerate(state.held):
            if not self.is_target[i] and held:
                kept_units, kept_xs = [], []
                for u, x in zip(self.units[i], self.xs[i], strict=True):
                    if u in state.in_progress:
                        kept_units.append(u)
                        kept_xs.append(x)
                    else:
                        pending.append((x, u, i))
                self.units[i], self.xs[i] = kept_units, kept_xs
        if not pending or not self.targets:
            return
        pending.sort(key=lambda p: -p[0])
        heap = [(self.util(i), i) for i in self.targets]
        heapq.heapify(heap)
        for x, unit, origin in pending:
            skipped = []
            while True:
                _, i = heapq.heappop(heap)
                if self.allowed(origin if isinstance(origin, int) else None, i) or not heap:
                    break
                skipped.append((self.util(i), i))
            self.moved_load += x
            self.transfer(x, unit, origin, i)
            heapq.heappush(heap, (self.util(i), i))
            for item in skipped:
                heapq.heappush(heap, item)

    def find_hot(self) -> tuple[float, float]:
        """Hot units and hosts; returns (load, capacity) left for the other members."""
        targets = self.targets
        rest_load = math.fsum(self.load[i] for i in targets)
        rest_cap = math.fsum(self.cap[i] for i in targets)
        if len(targets) < 2:
            return rest_load, rest_cap
        aim = self.options.aim
        xs = np.fromiter(chain.from_iterable(self.xs[i] for i in targets), dtype=float)
        owners = np.repeat(np.array(targets), [len(self.xs[i]) for i in targets])
        k = min(len(targets) - 1, len(xs))
        if k <= 0:
            return rest_load, rest_cap
        top = np.argpartition(-xs, k - 1)[:k]
        top = top[np.argsort(-xs[top], kind="stable")]
        flat_units = list(chain.from_iterable(self.units[i] for i in targets))
        free = sorted(targets, key=lambda i: (-self.cap[i], self.load[i], i))
        for j in top.tolist():
            x, unit, owner = float(xs[j]), flat_units[j], int(owners[j])
            host = owner
            if owner in self.hot:
                if unit in self.state.in_progress:
                    continue
                host = next((i for i in free if i not in self.hot), -1)
                if host < 0:
                    break
            if x / self.cap[host] <= rest_load / rest_cap * (1 + aim):
                break
            self.hot[host] = (unit, x)
            rest_load -= x
            rest_cap -= self.cap[host]
            if host != owner:
                self.pool(owner)  # materialise before the unit leaves
                pool = self.pools[owner]
                j_unit = pool.units.index(unit)
                pool.take(j_unit)
                if self.spend(1, x):
                    self.transfer(x, unit, owner, host)
                else:
                    pool.put(x, unit)
                    del self.hot[host]
                    rest_load += x
                    rest_cap += self.cap[host]
                    break
        return rest_load, rest_cap

    def _by_util(self, sign: float) -> _LazyHeap:
        """The non-hot targets, least loaded first (sign 1) or most loaded first (sign -1)."""
        normal = (i for i in self.targets if i not in self.hot)
        return _LazyHeap(lambda i: sign * self.util(i), normal, self.stamp)

    def _step(self, donor: int, receiver: int, need: float, band: float, delta: float) -> bool:
        """Moves load from ``donor`` to ``receiver``; False if nothing helps.

        First a move, then a swap, that closes ``need`` (else makes progress) within ``band``
        (the load the receiver may take and the donor may give while both stay inside the aim).
        When no unit fits the band, the move or swap that leaves the pair closest to even, if it
        brings both ends at least ``delta`` (utilisation) closer: large units then still move
        to where they lower the maximum.
        """
        give, take = self.pool(donor), self.pool(receiver)
        single = self.spread is None or self.spread.allows(donor, receiver)
        if band > _EPS:
            j = give.pick(need, band) if single else None
            if j is not None:
                return self._move(donor, receiver, j)
            pair = _swap(give, take, need, band)
            if pair is not None:
                return self._exchange(donor, receiver, pair)
        cd, cr = self.cap[donor], self.cap[receiver]
        ud, ur = self.util(donor), self.util(receiver)
        even = (self.load[donor] * cr - self.load[receiver] * cd) / (cd + cr)
        if even <= 0:
            return False

        def acceptable(net: float) -> bool:
            after_d = (self.load[donor] - net) / cd
            after_r = (self.load[receiver] + net) / cr
            return max(after_d, after_r) <= ud - delta and min(after_d, after_r) >= ur + delta

        j = give.pick(even, 2 * even) if single else None
        if j is not None and acceptable(give.xs[j]):
            return self._move(donor, receiver, j)
        j = give.pick(0.0, even) if single else None
        if j is not None and acceptable(give.xs[j]):
            return self._move(donor, receiver, j)
        pair = _swap(give, take, even, 2 * even)
        if pair is not None and acceptable(give.xs[pair[0]] - take.xs[pair[1]]):
            return self._exchange(donor, receiver, pair)
        return False

    def _move(self, donor: int, receiver: int, j: int) -> bool:
        give = self.pool(donor)
        if not self.spend(1, give.xs[j]):
            return False
        x, unit = give.take(j)
        self.transfer(x, unit, donor, receiver)
        return True

    def _exchange(self, donor: int, receiver: int, pair: tuple[int, int]) -> bool:
        give, take = self.pool(donor), self.pool(receiver)
        if not self.spend(2, give.xs[pair[0]] + take.xs[pair[1]]):
            return False
        xa, ua = give.take(pair[0])
        xb, ub = take.take(pair[1])
        self.transfer(xa, ua, donor, receiver)
        self.transfer(xb, ub, receiver, donor)
        return True

    def rebalance(self, rest_load: float, rest_cap: float) -> None:
        tol, aim = self.options.tolerance, self.options.aim
        mean = rest_load / rest_cap if rest_cap > 0 else 0.0
        normal = [i for i in self.targets if i not in self.hot]
        over = [i for i in normal if self.util(i) > mean * (1 + tol) + _EPS]
        # A hot member sets the maximum itself: anything beside its hot unit goes, tolerance or not.
        over += [h for h, (_, x) in self.hot.items() if self.load[h] > x * (1 + aim) + _EPS]
        under = [i for i in normal if self.util(i) < mean * (1 - tol) - _EPS]
        if not over and not under:
            self.reasons.append(f"every member within the {tol:.1%} imbalance tolerance")
            return
        self.hi, self.lo = mean * (1 + aim), mean * (1 - aim)
        over.sort(key=lambda i: -self.util(i))
        bounds = {d: self._donor_bounds(d) for d in over}
        shed = [
            (x, unit, d)
            for d in over
            for x, unit in self._shed_set(
                d, self.load[d] - bounds[d][0], self.load[d] - bounds[d][1]
            )
        ]
        if not self._pack_exactly(shed, set(over), under):
            self._pack(shed, set(over), under)
        delta = mean * aim
        receivers = self._by_util(1.0)
        for d in over:
            goal, floor = bounds[d]
            while self.load[d] > goal + _EPS and not self.budget_hit:
                candidates = receivers.tops(_CANDIDATES, exclude=d)
                if not any(
                    self._step(
                        d,
                        r,
                        self.load[d] - goal,
                        min(self.hi * self.cap[r] - self.load[r], self.load[d] - floor),
                        delta,
                    )
                    for r in candidates
                ):
                    break
        donors = self._by_util(-1.0)
        for r in sorted(under, key=self.util):
            goal = self.lo * self.cap[r]
            while self.load[r] < goal - _EPS and not self.budget_hit:
                candidates = donors.tops(_CANDIDATES, exclude=r)
                if any(self._reroute(s, r, goal - self.load[r]) for s in candidates):
                    continue
                if not any(
                    self._step(
                        d,
                        r,
                        goal - self.load[r],
                        min(
                            self.hi * self.cap[r] - self.load[r],
                            self.load[d] - self.lo * self.cap[d],
                        ),
                        delta,
                    )
                    for d in candidates
                ):
                    break
        self._undo_needless()

    def _reroute(self, s: int, r: int, need: float) -> bool:
        """Redirects to ``r`` a unit that arrived at ``s`` in this plan (no extra move), one
        that keeps ``s`` above the aim's lower end."""
        passing = self.arrived.get(s)
        if not passing or not passing.xs or not self.allowed(s, r):
            return False
        bound = min(self.hi * self.cap[r] - self.load[r], self.load[s] - self.lo * self.cap[s])
        j = passing.pick(need, bound) if bound > _EPS else None
        if j is None:
            return False
        self.transfer(passing.xs[j], passing.units[j], s, r)
        return True

    def _donor_bounds(self, d: int) -> tuple[float, float]:
        """(goal, floor): an overloaded member sheds to ``goal`` and not below ``floor``."""
        hot = self.hot.get(d)
        if hot:
            return hot[1] * (1 + self.options.aim), hot[1]
        return self.hi * self.cap[d], self.lo * self.cap[d]

    def _shed_set(self, d: int, need: float, allow: float) -> list[tuple[float, str]]:
        """Fewest units of ``d`` whose loads sum to at least ``need`` and at most ``allow``,
        taken out of its pool: repeatedly the smallest unit that closes what is left, else the
        largest that fits."""
        pool = self.pool(d)
        chosen: list[tuple[float, str]] = []
        total = 0.0
        while total < need - _EPS:
            j = pool.pick(need - total, allow - total)
            if j is None:
                break
            x, unit = pool.take(j)
            chosen.append((x, unit))
            total += x
        return chosen

    def _pack(
        self, items: list[tuple[float, str, int]], donors: set[int], under: list[int]
    ) -> None:
        """Places shed units, largest first: on an underloaded member while one still needs
        load and has room, else best fit (the member with the least room that still fits),
        else — a unit too big for any room — on the member with the most room if that lowers
        the pair's maximum; that member then sheds its own smaller units in turn (a chain, fewer
        moves than cutting the big unit's worth out of small ones). A unit that fits nowhere
        goes back to its donor."""
        room = {
            i: self.hi * self.cap[i] - self.load[i]
            for i in self.targets
            if i not in self.hot and i not in donors
        }
        fits = sorted((r, i) for i, r in room.items())
        needy = _LazyHeap(lambda i: self.load[i] - self.lo * self.cap[i], under, self.stamp)
        queue = [(-x, n, unit, d) for n, (x, unit, d) in enumerate(items)]
        heapq.heapify(queue)
        serial = len(queue)
        while queue:
            negative, _, unit, d = heapq.heappop(queue)
            x = -negative
            target = None if self.budget_hit else self._fit(x, d, fits, room, needy)
            if target is None and fits and not self.budget_hit:
                widest = fits[-1][1]
                if self.load[widest] + x < self.load[d] - _EPS and self.allowed(d, widest):
                    target = widest
            if target is None or not self.spend(1, x):
                self.pool(d).put(x, unit)
                continue
            self.transfer(x, unit, d, target)
            del fits[bisect_left(fits, (room[target], target))]
            room[target] -= x
            if room[target] >= -_EPS:
                fits.insert(bisect_left(fits, (room[target], target)), (room[target], target))
                continue
            # Overflowed: the receiver becomes a donor of its own (unmoved) units.
            del room[target]
            need = self.load[target] - self.hi * self.cap[target]
            allow = self.load[target] - self.lo * self.cap[target]
            for y, other in self._shed_set(target, need, allow):
                heapq.heappush(queue, (-y, serial, other, target))
                serial += 1

    def _pack_exactly(
        self, items: list[tuple[float, str, int]], donors: set[int], under: list[int]
    ) -> bool:
        """Places the shed units so that every receiver ends inside the aim, if a depth-first
        search finds such a placement within its node budget (small cases only; no topology
        spread). Returns whether it did."""
        receivers = [i for i in self.targets if i not in self.hot and i not in donors]
        if (
            not items
            or len(items) > _EXACT_ITEMS
            or len(receivers) > _EXACT_RECEIVERS
            or self.spread is not None
            or len(items) > self.moves_left
            or math.fsum(x for x, _, _ in items) > self.load_left
        ):
            return False
        order = sorted(items, key=lambda item: -item[0])
        xs = [x for x, _, _ in order]
        tail = [math.fsum(xs[k:]) for k in range(len(xs) + 1)]
        room = [self.hi * self.cap[i] - self.load[i] for i in receivers]
        need = [max(0.0, self.lo * self.cap[i] - self.load[i]) for i in receivers]
        got = [0.0] * len(receivers)
        chosen = [0] * len(order)
        nodes = 0
        missing = math.fsum(need)

        def search(k: int) -> bool:
            nonlocal nodes, missing
            nodes += 1
            if k == len(xs):
                return missing <= _EPS
            if nodes > _EXACT_NODES or tail[k] < missing - _EPS:
                return False
            seen: set[tuple[float, float]] = set()
            ranked = sorted(
                range(len(receivers)), key=lambda j: (got[j] >= need[j], room[j] - got[j])
            )
            for j in ranked:
                left = room[j] - got[j]
                if xs[k] > left + _EPS:
                    continue
                key = (round(left, 9), round(need[j] - got[j], 9))
                if key in seen:
                    continue
                seen.add(key)
                covered = min(xs[k], max(0.0, need[j] - got[j]))
                got[j] += xs[k]
                missing -= covered
                chosen[k] = j
                if search(k + 1):
                    return True
                got[j] -= xs[k]
                missing += covered
            return False

        if not search(0):
            return False
        for (x, unit, d), j in zip(order, chosen, strict=True):
            self.spend(1, x)
            self.transfer(x, unit, d, receivers[j])
        return True

    def _fit(
        self,
        x: float,
        donor: int,
        fits: list[tuple[float, int]],
        room: dict[int, float],
        needy: _LazyHeap,
    ) -> int | None:
        """The receiver of a unit of load ``x`` that stays within the aim: one of the neediest
        underloaded members with room, else the best fit."""
        for i in needy.tops(_CANDIDATES):
            if (
                i in room
                and self.load[i] < self.lo * self.cap[i] - _EPS
                and room[i] >= x - _EPS
                and self.allowed(donor, i)
            ):
                return i
        k = bisect_left(fits, (x - _EPS, -1))
        while k < len(fits):
            if self.allowed(donor, fits[k][1]):
                return fits[k][1]
            k += 1
        return None

    def _undo_needless(self) -> None:
        """Sends moved units home where that keeps both ends inside the aim: the greedy phases
        can overshoot, and a move that is not needed is churn."""
        for unit, origin, at in self.builder.moved():
            if not isinstance(origin, int) or not self.is_target[origin] or origin in self.hot:
                continue
            x = self.load_of(unit)
            if (
                self.load[origin] + x <= self.hi * self.cap[origin] + _EPS
                and self.load[at] - x >= self.lo * self.cap[at] - _EPS
                and self.allowed(at, origin)
            ):
                self.moves_left += 1
                self.load_left += x
                self.moved_load -= x
                self.transfer(x, unit, at, origin)

    # -- result --------------------------------------------------------------------------------

    def load_ratio(self, loads: list[float]) -> float:
        if not self.targets or self.total_load <= 0:
            return 0.0
        mean = self.total_load / math.fsum(self.cap[i] for i in self.targets)
        if mean <= 0:  # a total load so small its mean underflows: nothing to tell apart
            return 1.0
        return max(loads[i] / self.cap[i] for i in self.targets) / mean

    def lower_bound(self, achieved: float) -> int:
        """Homeless and evacuated units, plus for each target that started above the achieved
        largest load / capacity the fewest of its own units whose removal gets it there."""
        state = self.state
        bound = len(state.homeless)
        bound += sum(
            sum(1 for u in held if u not in state.in_progress)
            for i, held in enumerate(state.held)
            if not self.is_target[i]
        )
        for i in self.targets:
            excess = self.initial[i] - achieved * self.cap[i] - _EPS
            if excess <= 0:
                continue
            held = state.held[i]
            xs = sorted((self.load_of(u) for u in held if u not in state.in_progress), reverse=True)
            shed = 0
            while excess > 0 and shed < len(xs):
                excess -= xs[shed]
                shed += 1
            bound += shed
        return bound

    def hot_report(self) -> HotUnit | None:
        if not self.hot or self.total_load <= 0:
            return None
        mean = self.total_load / math.fsum(self.cap[i] for i in self.targets)
        if mean <= 0:  # the mean underflows: no unit stands out
            return None
        host, (unit, x) = max(self.hot.items(), key=lambda kv: kv[1][1] / self.cap[kv[0]])
        floor = x / self.cap[host] / mean
        if not math.isfinite(floor):  # loads at the edge of floating point: no advice to give
            return None
        # From `floor`, not x / (mean * cap): that product underflows to 0 for denormal loads.
        split = max(2, math.ceil(floor))
        self.reasons.append(
            f"unit {unit!r} alone carries {floor:.2f}x the mean member load: "
            f"split it into {split} to balance further"
        )
        return HotUnit(unit, self.state.members[host].name, x, floor, split)


def plan_loads(state: State, options: BalancedParameters) -> Plan:
    """Plans ``state`` by load (module docstring)."""
    planner = _Planner(state, options)
    before_counts = [state.count(i) for i in range(len(state.members))]
    planner.place_homeless()
    if planner.targets:
        rest_load, rest_cap = planner.find_hot()
        planner.rebalance(rest_load, rest_cap)
    if planner.budget_hit:
        planner.reasons.append("churn budget reached: the next plan continues")
    after = planner.load_ratio(planner.load)
    mean = (
        planner.total_load / math.fsum(planner.cap[i] for i in planner.targets)
        if planner.targets
        else 0.0
    )
    hot = planner.hot_report()
    builder = planner.builder
    quality = PlanQuality(
        units=state.total,
        members=len(planner.targets),
        moves=builder.moves,
        lower_bound=planner.lower_bound(after * mean),
        max_mean_before=count_ratio(before_counts, state, planner.targets),
        max_mean_after=count_ratio(builder.counts(), state, planner.targets),
        load_max_mean_before=planner.load_ratio(planner.initial),
        load_max_mean_after=after,
        moved_load=planner.moved_load,
        rounds=None if planner.budget_hit else (1 if builder.moves else 0),
        converged=not planner.budget_hit,
        hot_unit=hot,
        reasons=tuple(planner.reasons),
    )
    return builder.build(quality)
