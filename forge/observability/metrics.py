"""Record metrics from anywhere; reduce them across processes once per step.

Any code, in the controller or in any actor process, calls::

    record_metric("generator/tokens_per_s", 512.0)                 # mean by default
    record_metric("buffer/dropped", 3, Reduce.SUM)
    with timer("time/trainer_step"):
        ...

Each process accumulates *partial states* in its :class:`MetricCollector`: small picklable
dataclasses that merge exactly (a mean keeps ``(sum, count)``, not a running mean). Once per
training step the runtime gathers every process's ``collector.flush()`` and reduces them with
:func:`merge_states`, so the mean over 4 generators weights each sample equally no matter
how the samples were spread. ``STD`` is the population standard deviation (``ddof=0``, like
``numpy.std``), merged with Chan et al.'s pairwise formula from ``(count, mean, m2)``:
``sumsq - sum**2 / n`` cancels catastrophically when the spread is small against the mean.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, ClassVar

__all__ = [
    "MaxState",
    "MeanState",
    "MetricCollector",
    "MinState",
    "PartialState",
    "Reduce",
    "StdState",
    "SumState",
    "get_collector",
    "merge_states",
    "record_metric",
    "reset_collector",
    "timer",
]


class Reduce(str, enum.Enum):
    """How values of one metric key combine, within a process and across processes."""

    MEAN = "mean"
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    STD = "std"


@dataclass
class PartialState:
    """Mergeable summary of the values recorded for one key. Subclasses per :class:`Reduce`."""

    reduce: ClassVar[Reduce]

    @classmethod
    def first(cls, value: float) -> PartialState:
        """A state holding the single value ``value``."""
        raise NotImplementedError

    def add(self, value: float) -> None:
        """Fold one more value into this state."""
        self.merge(self.first(value))

    def merge(self, other: PartialState) -> None:
        """Fold another state of the same kind into this one, in place."""
        raise NotImplementedError

    def result(self) -> float:
        """The reduced value."""
        raise NotImplementedError


@dataclass
class MeanState(PartialState):
    reduce: ClassVar[Reduce] = Reduce.MEAN
    total: float
    count: int

    @classmethod
    def first(cls, value: float) -> MeanState:
        return cls(total=value, count=1)

    def merge(self, other: PartialState) -> None:
        assert isinstance(other, MeanState)
        self.total += other.total
        self.count += other.count

    def result(self) -> float:
        return self.total / self.count


@dataclass
class SumState(PartialState):
    reduce: ClassVar[Reduce] = Reduce.SUM
    value: float

    @classmethod
    def first(cls, value: float) -> SumState:
        return cls(value)

    def merge(self, other: PartialState) -> None:
        assert isinstance(other, SumState)
        self.value += other.value

    def result(self) -> float:
        return self.value


@dataclass
class MaxState(PartialState):
    reduce: ClassVar[Reduce] = Reduce.MAX
    value: float

    @classmethod
    def first(cls, value: float) -> MaxState:
        return cls(value)

    def merge(self, other: PartialState) -> None:
        assert isinstance(other, MaxState)
        self.value = max(self.value, other.value)

    def result(self) -> float:
        return self.value


@dataclass
class MinState(PartialState):
    reduce: ClassVar[Reduce] = Reduce.MIN
    value: float

    @classmethod
    def first(cls, value: float) -> MinState:
        return cls(value)

    def merge(self, other: PartialState) -> None:
        assert isinstance(other, MinState)
        self.value = min(self.value, other.value)

    def result(self) -> float:
        return self.value


@dataclass
class StdState(PartialState):
    """``count`` values with mean ``mean`` and sum of squared deviations ``m2``."""

    reduce: ClassVar[Reduce] = Reduce.STD
    count: int
    mean: float
    m2: float

    @classmethod
    def first(cls, value: float) -> StdState:
        return cls(count=1, mean=value, m2=0.0)

    def merge(self, other: PartialState) -> None:
        assert isinstance(other, StdState)
        count = self.count + other.count
        delta = other.mean - self.mean
        # Chan, Golub & LeVeque (1979): exact pairwise combination of (n, mean, M2).
        self.m2 += other.m2 + delta * delta * self.count * other.count / count
        self.mean += delta * other.count / count
        self.count = count

    def result(self) -> float:
        return math.sqrt(max(self.m2, 0.0) / self.count)


_STATE_TYPES: dict[Reduce, type[PartialState]] = {
    Reduce.MEAN: MeanState,
    Reduce.SUM: SumState,
    Reduce.MAX: MaxState,
    Reduce.MIN: MinState,
    Reduce.STD: StdState,
}


def _conflict(key: str, old: Reduce, new: Reduce) -> ValueError:
    return ValueError(
        f"metric {key!r} was recorded with Reduce.{old.name} and now with Reduce.{new.name}; "
        "use one reduction per key (or give the other one its own key)"
    )


class MetricCollector:
    """One process's metric accumulator. Thread-safe; state is per instance."""

    def __init__(self) -> None:
        self._states: dict[str, PartialState] = {}
        self._lock = threading.Lock()

    def record(self, key: str, value: Any, reduce: Reduce | str = Reduce.MEAN) -> None:
        """Fold ``value`` (anything ``float()`` accepts, e.g. a 0-d tensor) into ``key``."""
        reduce = Reduce(reduce)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"metric {key!r}: value must be a number, got {value!r} ({type(value).__name__})"
            ) from None
        with self._lock:
            state = self._states.get(key)
            if state is None:
                self._states[key] = _STATE_TYPES[reduce].first(number)
            elif state.reduce is not reduce:
                raise _conflict(key, state.reduce, reduce)
            else:
                state.add(number)

    def flush(self) -> dict[str, PartialState]:
        """Return the accumulated states and start over empty."""
        with self._lock:
            states, self._states = self._states, {}
        return states

    def __len__(self) -> int:
        return len(self._states)


def merge_states(states: Iterable[Mapping[str, PartialState]]) -> dict[str, float]:
    """Reduce the flushed states of many processes into one final value per key."""
    merged: dict[str, PartialState] = {}
    for process_states in states:
        for key, state in process_states.items():
            if key not in merged:
                # Copy, so merging never mutates a caller's state object.
                merged[key] = replace(state)
            elif merged[key].reduce is not state.reduce:
                raise _conflict(key, merged[key].reduce, state.reduce)
            else:
                merged[key].merge(state)
    return {key: state.result() for key, state in sorted(merged.items())}


_collector: MetricCollector | None = None


def get_collector() -> MetricCollector:
    """This process's collector, created on first use."""
    global _collector
    if _collector is None:
        _collector = MetricCollector()
    return _collector


def reset_collector() -> None:
    """Drop this process's collector and everything recorded in it (for tests)."""
    global _collector
    _collector = None


def record_metric(key: str, value: Any, reduce: Reduce | str = Reduce.MEAN) -> None:
    """Record ``value`` under ``key`` in this process's collector."""
    get_collector().record(key, value, reduce)


@contextmanager
def timer(key: str, reduce: Reduce | str = Reduce.MEAN) -> Iterator[None]:
    """Record the seconds spent in the ``with`` block under ``key``, even if it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record_metric(key, time.perf_counter() - start, reduce)
