"""Named-dimension shapes shared by process meshes, actor meshes and value meshes."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from controller._context import Point

T = TypeVar("T")


class Shape:
    """Dimensions (``labels``/``sizes``) over a row-major list of global ``ranks``."""

    __slots__ = ("labels", "sizes", "ranks")

    def __init__(self, labels: tuple[str, ...], sizes: tuple[int, ...], ranks: tuple[int, ...]):
        self.labels, self.sizes, self.ranks = tuple(labels), tuple(sizes), tuple(ranks)

    @classmethod
    def full(cls, sizes: dict[str, int]) -> Shape:
        total = 1
        for s in sizes.values():
            total *= s
        return cls(tuple(sizes), tuple(sizes.values()), tuple(range(total)))

    def __len__(self) -> int:
        return len(self.ranks)

    def __eq__(self, other) -> bool:
        return isinstance(other, Shape) and (self.labels, self.sizes, self.ranks) == (
            other.labels,
            other.sizes,
            other.ranks,
        )

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in zip(self.labels, self.sizes))
        return f"Shape({dims})"

    def size(self, dim: str) -> int:
        if dim not in self.labels:
            raise KeyError(f"mesh has no dimension {dim!r}; its dimensions are {self.labels}")
        return self.sizes[self.labels.index(dim)]

    def sizes_dict(self) -> dict[str, int]:
        return dict(zip(self.labels, self.sizes))

    def coords(self) -> Iterator[tuple[int, ...]]:
        return itertools.product(*(range(s) for s in self.sizes))

    def points(self) -> list[Point]:
        return [Point(i, dict(zip(self.labels, c))) for i, c in enumerate(self.coords())]

    def slice(self, **dims: int | slice) -> Shape:
        """Select along named dimensions; an int index removes that dimension."""
        for d in dims:
            if d not in self.labels:
                raise KeyError(f"cannot slice {d!r}: the mesh's dimensions are {self.labels}")
        keep: list[list[int]] = []
        for label, size in zip(self.labels, self.sizes):
            sel = dims.get(label, slice(None))
            if isinstance(sel, int):
                if not -size <= sel < size:
                    raise IndexError(f"{label}={sel} is out of range for size {size}")
                keep.append([sel % size])
            elif isinstance(sel, slice):
                keep.append(list(range(*sel.indices(size))))
            else:
                raise TypeError(f"slice {label}= takes an int or a slice, got {sel!r}")
        strides = [1] * len(self.sizes)
        for i in range(len(self.sizes) - 2, -1, -1):
            strides[i] = strides[i + 1] * self.sizes[i + 1]
        ranks = tuple(
            self.ranks[sum(c * s for c, s in zip(combo, strides))]
            for combo in itertools.product(*keep)
        )
        labels = tuple(lb for lb in self.labels if not isinstance(dims.get(lb), int))
        sizes = tuple(
            len(k) for lb, k in zip(self.labels, keep) if not isinstance(dims.get(lb), int)
        )
        return Shape(labels, sizes, ranks)

    def index_of(self, **coords: int) -> int:
        if set(coords) != set(self.labels):
            raise KeyError(
                f"give a coordinate for every dimension {self.labels}, got {tuple(coords)}"
            )
        idx = 0
        for label, size in zip(self.labels, self.sizes):
            c = coords[label]
            if not 0 <= c < size:
                raise IndexError(f"{label}={c} is out of range for size {size}")
            idx = idx * size + c
        return idx


class ValueMesh(Generic[T]):
    """One value per point of a mesh, as returned by ``call()``."""

    def __init__(self, shape: Shape, values: list[T]):
        self._shape = shape
        self._values = list(values)

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return iter(zip(self._shape.points(), self._values))

    def __repr__(self) -> str:
        return f"ValueMesh({self._shape}, {self._values!r})"

    def values(self) -> list[T]:
        return list(self._values)

    def items(self) -> list[tuple[Point, T]]:
        return list(self)

    def item(self, **coords: int) -> T:
        """The value at ``coords`` (e.g. ``.item(procs=1)``); no coords for a single value."""
        if not coords and len(self._values) == 1:
            return self._values[0]
        return self._values[self._shape.index_of(**coords)]

    @property
    def shape(self) -> Shape:
        return self._shape

    def size(self, dim: str) -> int:
        return self._shape.size(dim)

    def slice(self, **dims: Any) -> ValueMesh[T]:
        sub = self._shape.slice(**dims)
        pos = {r: i for i, r in enumerate(self._shape.ranks)}
        return ValueMesh(sub, [self._values[pos[r]] for r in sub.ranks])
