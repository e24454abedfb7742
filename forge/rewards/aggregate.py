"""Run several reward functions on one response and combine their scores.

A reward function is any callable ``(prompt: str, response: str, target) -> float``. Its name,
used as the key of ``RewardResult.components``, is its ``name`` attribute when it has one,
else its ``__name__`` (plain functions), else its class name.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["RewardError", "RewardFn", "RewardResult", "evaluate_rewards", "reward_name"]


class RewardFn(Protocol):
    """The reward-function interface: score ``response`` to ``prompt`` against ``target``."""

    def __call__(self, prompt: str, response: str, target: Any) -> float: ...


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


def _as_reward(name: str, value: Any) -> float:
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"reward function {name!r} returned {type(value).__name__} {value!r}; "
            "it must return a float"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"reward function {name!r} returned {value}; rewards must be finite")
    return value


def _weights_by_name(
    names: list[str], weights: Sequence[float] | Mapping[str, float] | None
) -> dict[str, float]:
    if weights is None:
        return dict.fromkeys(names, 1.0)
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ValueError(f"weights for unknown reward functions {unknown}; known: {names}")
        return {n: float(weights.get(n, 1.0)) for n in names}
    if len(weights) != len(names):
        raise ValueError(
            f"got {len(weights)} weights for {len(names)} reward functions {names}; "
            "pass one weight per function, or a dict by name"
        )
    return {n: float(w) for n, w in zip(names, weights)}


def evaluate_rewards(
    fns: Sequence[Callable[..., Any]],
    prompt: str,
    response: str,
    target: Any,
    weights: Sequence[float] | Mapping[str, float] | None = None,
    aggregator: Callable[[dict[str, float]], float] | None = None,
) -> RewardResult:
    """Score ``response`` with every function in ``fns`` and combine the scores.

    The default total is the weighted sum; ``weights`` is one float per function, or a dict
    by name (missing names weigh 1.0), default all 1.0. A custom ``aggregator`` receives the
    components dict and returns the total; it cannot be combined with ``weights``.

    Raises ``RewardError`` naming the function when one raises (the original exception is
    its ``__cause__``), ``TypeError`` / ``ValueError`` naming it when it returns a non-number
    or a non-finite number.
    """
    if not fns:
        raise ValueError("evaluate_rewards needs at least one reward function")
    if weights is not None and aggregator is not None:
        raise ValueError("pass weights or aggregator, not both; fold the weights into it")
    names = [reward_name(fn) for fn in fns]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"reward functions share the names {dupes}; give each a distinct `name`")
    weight_by_name = _weights_by_name(names, weights)

    components: dict[str, float] = {}
    for name, fn in zip(names, fns):
        try:
            value = fn(prompt, response, target)
        except Exception as e:
            raise RewardError(name, e) from e
        components[name] = _as_reward(name, value)

    if aggregator is None:
        total = sum(weight_by_name[n] * v for n, v in components.items())
    else:
        total = _as_reward("<aggregator>", aggregator(dict(components)))
    return RewardResult(total=float(total), components=components)
