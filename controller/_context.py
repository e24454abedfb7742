"""Where am I? The rank of this process in its mesh, and the actor running right now."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

current_actor: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "forge_current_actor", default=None
)


@dataclass(frozen=True)
class Point:
    """A position in a mesh: ``rank`` is the linear index, ``coords`` the index per dimension."""

    rank: int
    coords: dict[str, int] = field(default_factory=dict)

    def __getitem__(self, dim: str) -> int:
        return self.coords[dim]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.coords.items())
        return f"Point(rank={self.rank}{', ' if inner else ''}{inner})"


_rank = Point(0, {})
_sizes: dict[str, int] = {}


def set_process_rank(rank: int, sizes: dict[str, int]) -> None:
    global _rank, _sizes
    coords, rem = {}, rank
    for dim in reversed(list(sizes)):
        coords[dim] = rem % sizes[dim]
        rem //= sizes[dim]
    _rank, _sizes = Point(rank, dict(reversed(coords.items()))), dict(sizes)


def current_rank() -> Point:
    """This process's position in its process mesh (``rank 0`` in the controller)."""
    return _rank


def current_size() -> dict[str, int]:
    """The sizes of this process's mesh, by dimension (``{}`` in the controller)."""
    return dict(_sizes)
