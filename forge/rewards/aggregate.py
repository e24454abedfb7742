"""Run several reward functions on one response and combine their scores.

A reward function is any callable ``(prompt: str, response: str, target) -> float``. Its name,
used as the key of ``RewardResult.components``, is its ``name`` attribute when it has one,
else its ``__name__`` (plain functions), else its class name.

A *vector* reward function returns a dict ``{component: float}`` instead: each key becomes a
component of its own (the key as is, no prefix), so one judge can report, say, correctness
and style together. Component names must be unique across all the functions: a key equal to
another function's name or to a key another function returns is an error. Turning the
components of a group of responses into one scalar each (weighted sum, minimum, Pareto rank)
is ``forge.rewards.vector``'s job.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.errors import CallTimeoutError

__all__ = [
    "RewardError",
    "RewardFn",
    "RewardResult",
    "RewardTimeoutError",
    "evaluate_rewards",
    "evaluate_rewards_batch",
    "reward_name",
]


class RewardFn(Protocol):
    """The reward-function interface: score ``response`` to ``prompt`` against ``target``."""

    def __call__(self, prompt: str, response: str, target: Any) -> float | Mapping[str, float]: ...


class RewardError(RuntimeError):
    """A reward function raised. ``reward_name`` names it; the cause is chained."""

    def __init__(self, reward_name: str, cause: BaseException) -> None:
        super().__init__(f"reward function {reward_name!r} raised {type(cause).__name__}: {cause}")
        self.reward_name = reward_name
        self._cause_text = f"{type(cause).__name__}: {cause}"

    def __reduce__(self):
        # Travels between processes: rebuild from text (the cause object may not pickle).
        return (_rebuild_reward_error, (self.reward_name, self._cause_text))


def _rebuild_reward_error(name: str, cause_text: str) -> RewardError:
    err = RewardError.__new__(RewardError)
    RuntimeError.__init__(err, f"reward function {name!r} raised {cause_text}")
    err.reward_name, err._cause_text = name, cause_text
    return err


class RewardTimeoutError(CallTimeoutError):
    """A batch of responses was not scored within ``rollout.reward_timeout_s``.

    A reward function that can take unbounded time on some input (a parser, a judge, a
    sandbox) must bound itself (``MathReward``: ``timeout_s`` per answer, scored 0); this is
    the backstop for one that does not. The run stops rather than train on made-up rewards.
    """


@dataclass
class RewardResult:
    """``total`` is the aggregated reward; ``components`` each function's own score by name."""

    total: float
    components: dict[str, float] = field(default_factory=dict)


def reward_name(fn: Callable[..., Any]) -> str:
    """The name a reward function's score is reported under (see the module docstring)."""
    name = getattr(fn, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(fn, "__name__", None) or type(fn).__name__


def _as_reward(name: str, value: Any, key: str | None = None) -> float:
    what = f"reward function {name!r} returned" + ("" if key is None else f" for {key!r}")
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"{what} {type(value).__name__} {value!r}; it must return a float "
            "(or a dict of floats by component name)"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} {value}; rewards must be finite")
    return value


def _components_of(name: str, value: Any, owner: dict[str, str]) -> dict[str, float]:
    """One function's components: ``{name: value}`` for a float, the dict's items for a vector.

    ``owner`` maps each component name claimed so far (and every function's name) to the
    function that claimed it; keys claimed here are added to it.
    """
    if not isinstance(value, Mapping):
        return {name: _as_reward(name, value)}
    if not value:
        raise ValueError(
            f"reward function {name!r} returned an empty dict; a vector reward needs at least "
            "one component"
        )
    out: dict[str, float] = {}
    for key, v in value.items():
        if not isinstance(key, str) or not key:
            raise TypeError(
                f"reward function {name!r} returned a dict with key {key!r}; component names "
                "must be non-empty strings"
            )
        other = owner.setdefault(key, name)
        if other != name:
            raise ValueError(
                f"reward function {name!r} returned component {key!r}, which reward function "
                f"{other!r} already reports; rename the key or give a function a distinct `name`"
            )
        out[key] = _as_reward(name, v, key)
    return out


def _weights_by_component(
    names: list[str],
    keys_by_fn: dict[str, list[str]],
    weights: Sequence[float] | Mapping[str, float] | None,
) -> dict[str, float]:
    """The weight of every component: a vector function's weight applies to each of its keys,
    unless a dict of weights names the key itself."""
    if weights is None:
        return {k: 1.0 for keys in keys_by_fn.values() for k in keys}
    if isinstance(weights, Mapping):
        components = [k for keys in keys_by_fn.values() for k in keys]
        known = list(dict.fromkeys([*names, *components]))
        unknown = sorted(set(weights) - set(known))
        if unknown:
            raise ValueError(
                f"weights for unknown reward functions or components {unknown}; known: {known}"
            )
        return {
            k: float(weights.get(k, weights.get(n, 1.0)))
            for n, keys in keys_by_fn.items()
            for k in keys
        }
    _check_weight_count(names, weights)
    return {k: float(w) for keys, w in zip(keys_by_fn.values(), weights) for k in keys}


def _check_weight_count(names: list[str], weights: Sequence[float]) -> None:
    if len(weights) != len(names):
        raise ValueError(
            f"got {len(weights)} weights for {len(names)} reward functions {names}; "
            "pass one weight per function, or a dict by name"
        )


def evaluate_rewards(
    fns: Sequence[Callable[..., Any]],
    prompt: str,
    response: str,
    target: Any,
    weights: Sequence[float] | Mapping[str, float] | None = None,
    aggregator: Callable[[dict[str, float]], float] | None = None,
) -> RewardResult:
    """Score ``response`` with every function in ``fns`` and combine the scores.

    ``components`` holds one entry per float-returning function (under its name) and one per
    key of each dict-returning (vector) function (under the key). The default total is the
    weighted sum of the components; ``weights`` is one float per function (a vector
    function's weight applies to each of its components), or a dict by function or component
    name (a component's own weight wins over its function's; missing names weigh 1.0),
    default all 1.0. A custom ``aggregator`` receives the components dict and returns the
    total; it cannot be combined with ``weights``.

    Raises ``RewardError`` naming the function when one raises (the original exception is
    its ``__cause__``), ``TypeError`` / ``ValueError`` naming it (and the key, for a vector
    reward) when it returns a non-number or a non-finite number, and ``ValueError`` naming
    both functions when a component name is reported twice.
    """
    return evaluate_rewards_batch(fns, [(prompt, response, target)], weights, aggregator)[0]


def evaluate_rewards_batch(
    fns: Sequence[Callable[..., Any]],
    items: Sequence[tuple[str, str, Any]],
    weights: Sequence[float] | Mapping[str, float] | None = None,
    aggregator: Callable[[dict[str, float]], float] | None = None,
) -> list[RewardResult]:
    """``evaluate_rewards`` on each ``(prompt, response, target)`` of ``items``. A function
    with a ``score_batch(items) -> list`` method (``MathReward``) scores them all in one
    call; the others are called once per item."""
    if not fns:
        raise ValueError("evaluate_rewards needs at least one reward function")
    if weights is not None and aggregator is not None:
        raise ValueError("pass weights or aggregator, not both; fold the weights into it")
    names = [reward_name(fn) for fn in fns]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"reward functions share the names {dupes}; give each a distinct `name`")
    if weights is not None and not isinstance(weights, Mapping):
        _check_weight_count(names, weights)  # before scoring anything

    values = [_score_all(name, fn, items) for name, fn in zip(names, fns)]
    return [_combine(names, [v[i] for v in values], weights, aggregator) for i in range(len(items))]


def _score_all(name: str, fn: Callable[..., Any], items: Sequence[tuple]) -> list[Any]:
    batch = getattr(fn, "score_batch", None)
    try:
        values = list(batch(items)) if callable(batch) else [fn(p, r, t) for p, r, t in items]
    except Exception as e:
        raise RewardError(name, e) from e
    if len(values) != len(items):
        raise TypeError(
            f"reward function {name!r}: score_batch returned {len(values)} values for "
            f"{len(items)} items"
        )
    return values


def _combine(
    names: list[str],
    values: list[Any],
    weights: Sequence[float] | Mapping[str, float] | None,
    aggregator: Callable[[dict[str, float]], float] | None,
) -> RewardResult:
    """One item's ``RewardResult`` from each function's value on it."""
    components: dict[str, float] = {}
    keys_by_fn: dict[str, list[str]] = {}
    owner = {n: n for n in names}  # a vector key may not reuse another function's name
    for name, value in zip(names, values):
        mine = _components_of(name, value, owner)
        keys_by_fn[name] = list(mine)
        components.update(mine)

    if aggregator is None:
        weight_of = _weights_by_component(names, keys_by_fn, weights)
        total = sum(weight_of[k] * v for k, v in components.items())
    else:
        total = _as_reward("<aggregator>", aggregator(dict(components)))
    return RewardResult(total=float(total), components=components)
