"""Turn the vector rewards of a group of responses into one scalar reward each.

A vector reward gives each response several named components (``RewardResult.components``,
e.g. ``{"correct": 1.0, "concise": -0.3}``). GRPO-style advantages need one scalar per
response, computed over the G completions of one prompt. An *aggregator* does that::

    agg = build_aggregator("pareto")               # or "weighted_sum", "min", a callable
    rewards_g = agg([r.components for r in results_g])   # one float per completion

Protocol: an aggregator is any callable ``(components_g: list[dict[str, float]]) ->
list[float]`` returning one float per member, in the members' order. Every member of a group
must have the same component names. All components are "higher is better".

Built-ins:

- ``weighted_sum(weights)``: ``sum_k w_k * c_k`` per member (missing names weigh 1.0).
- ``minimum()``: ``min_k c_k`` per member (the worst component decides).
- ``pareto_rank()``: non-dominated sorting within the group, see ``ParetoRank``. It depends
  on the whole group (a member's scalar changes with its peers), unlike the other two, and
  needs no scale calibration between components.

``component_means`` averages each component over a batch, for per-step logging.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "Minimum",
    "ParetoRank",
    "WeightedSum",
    "build_aggregator",
    "component_means",
    "minimum",
    "pareto_fronts",
    "pareto_rank",
    "weighted_sum",
]

Aggregator = Callable[[list[dict[str, float]]], list[float]]


def pad_components(components: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """The same names for every member (sorted; a name a member lacks is 0.0), as the
    aggregators need."""
    names = sorted(set().union(*components))
    return [{n: float(c.get(n, 0.0)) for n in names} for c in components]


def _component_names(components_g: Sequence[Mapping[str, float]]) -> list[str]:
    """The components shared by every member, in the first member's order; raises
    ``ValueError`` if members differ, a group member has none, or a value is not finite."""
    if not components_g:
        return []
    names = list(components_g[0])
    if not names:
        raise ValueError("group member 0 has no reward components; aggregators need at least one")
    for i, comps in enumerate(components_g):
        if set(comps) != set(names):
            missing = sorted(set(names) - set(comps))
            extra = sorted(set(comps) - set(names))
            raise ValueError(
                f"group member {i} has components {sorted(comps)} but member 0 has "
                f"{sorted(names)} (missing {missing}, extra {extra}); every response of a "
                "group must be scored by the same reward functions"
            )
        for k, v in comps.items():
            if not math.isfinite(v):
                raise ValueError(f"group member {i} has component {k!r} = {v}; must be finite")
    return names


@dataclass(frozen=True)
class WeightedSum:
    """``sum_k weights[k] * c_k`` per member; components absent from ``weights`` weigh 1.0."""

    weights: dict[str, float] = field(default_factory=dict)

    def __call__(self, components_g: list[dict[str, float]]) -> list[float]:
        names = _component_names(components_g)
        unknown = sorted(set(self.weights) - set(names))
        if components_g and unknown:
            raise ValueError(
                f"weighted_sum has weights for unknown components {unknown}; the known "
                f"components are {names}"
            )
        w = {k: float(self.weights.get(k, 1.0)) for k in names}
        return [float(sum(w[k] * c[k] for k in names)) for c in components_g]


@dataclass(frozen=True)
class Minimum:
    """``min_k c_k`` per member: a response is only as good as its worst component."""

    def __call__(self, components_g: list[dict[str, float]]) -> list[float]:
        _component_names(components_g)
        return [float(min(c.values())) for c in components_g]


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` is at least as good as ``b`` everywhere and strictly better somewhere."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def pareto_fronts(points: Sequence[Sequence[float]]) -> list[int]:
    """The front index of each point under non-dominated sorting (0 = non-dominated).

    Front 0 holds the points no other point dominates; remove them, and front 1 holds the
    points no remaining point dominates; and so on. Equal points never dominate each other,
    so they share a front. ``O(G^2 F)`` for G points in F fronts: groups are small.
    """
    front = [-1] * len(points)
    remaining = list(range(len(points)))
    f = 0
    while remaining:
        current = [
            i
            for i in remaining
            if not any(_dominates(points[j], points[i]) for j in remaining if j != i)
        ]
        for i in current:
            front[i] = f
        remaining = [i for i in remaining if front[i] < 0]
        f += 1
    return front


@dataclass(frozen=True)
class ParetoRank:
    """Non-dominated sorting within the group, scaled to ``[0, 1]``.

    With ``front_i`` member i's front (0 = non-dominated, see ``pareto_fronts``) and ``F``
    the number of fronts in the group, member i gets::

        (F - 1 - front_i) / (F - 1)    if F > 1
        1.0                            if F == 1

    so the best front gets 1.0, the worst 0.0, and fronts in between are evenly spaced. A
    group that is a single front (e.g. all members equal, or a single member) gets 1.0
    everywhere: ``(F - 1 - front_i) / max(F - 1, 1)`` alone would give 0.0 there, and no
    member of such a group is worse than another. (Either way, group-normalised advantages
    are 0 for such a group.)
    """

    def __call__(self, components_g: list[dict[str, float]]) -> list[float]:
        names = _component_names(components_g)
        fronts = pareto_fronts([[c[k] for k in names] for c in components_g])
        n_fronts = max(fronts, default=-1) + 1
        if n_fronts == 1:
            return [1.0] * len(fronts)
        return [(n_fronts - 1 - f) / (n_fronts - 1) for f in fronts]


def weighted_sum(weights: Mapping[str, float] | None = None) -> WeightedSum:
    """An aggregator summing each member's components times ``weights`` (missing: 1.0).

    Weights naming a component the group does not have raise ``ValueError`` when applied.
    """
    return WeightedSum({str(k): float(v) for k, v in (weights or {}).items()})


def minimum() -> Minimum:
    """An aggregator taking each member's smallest component."""
    return Minimum()


def pareto_rank() -> ParetoRank:
    """An aggregator scoring each member by its Pareto front in the group (see ``ParetoRank``)."""
    return ParetoRank()


AGGREGATORS: dict[str, Callable[..., Aggregator]] = {
    "weighted_sum": weighted_sum,
    "min": minimum,
    "pareto": pareto_rank,
}


def build_aggregator(name_or_callable: str | Aggregator, **kwargs) -> Aggregator:
    """The aggregator called ``name_or_callable`` (one of ``AGGREGATORS``), built with
    ``kwargs`` (``weighted_sum`` takes ``weights``), or the callable itself.

    Raises ``ValueError`` for an unknown name or for ``kwargs`` given with a callable.
    """
    if callable(name_or_callable):
        if kwargs:
            raise ValueError(
                f"build_aggregator got options {sorted(kwargs)} with a callable aggregator; "
                "options only apply to the built-in names, so bind them into the callable"
            )
        return name_or_callable
    if not isinstance(name_or_callable, str):
        raise TypeError(
            "build_aggregator takes a name or a callable (components_g) -> list[float], got "
            f"{type(name_or_callable).__name__}"
        )
    if name_or_callable not in AGGREGATORS:
        raise ValueError(
            f"unknown aggregator type: {name_or_callable!r}; choose one of {sorted(AGGREGATORS)} "
            "or pass a callable (components_g) -> list[float]"
        )
    return AGGREGATORS[name_or_callable](**kwargs)


def component_means(components: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The mean of each component over ``components`` (over the members that have it), in
    order of first appearance; ``{}`` for no members. For per-step logging."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for comps in components:
        for k, v in comps.items():
            sums[k] = sums.get(k, 0.0) + float(v)
            counts[k] = counts.get(k, 0) + 1
    return {k: sums[k] / counts[k] for k in sums}
