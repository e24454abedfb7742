"""Versioned weights: the trainer pushes ``(state_dict, version)``, generators pull a version.

HF parameter names (``model.layers.0.self_attn.q_proj.weight``) are the contract between the
trainer and the generators; a transport moves the bytes and never renames anything.

* :class:`WeightTransport` is the pluggable part (shared memory on one host, a safetensors
  directory on a shared filesystem, ...), implemented in sibling files that import this one
  and registered by name in ``forge.weights.registry`` (which this module never imports).
  ``push`` returns a :class:`WeightHandle`, a small picklable description of where the bytes
  are, which can be sent to another process and pulled there with
  ``forge.weights.registry.pull_handle``.
* :class:`WeightStore` sits on the pushing side and keeps track of the versions: which exist,
  which is latest, and a retention policy (``keep_last``) so old versions do not pile up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from forge.weights.adapter import ADAPTER_KEY

__all__ = [
    "TensorMeta",
    "WeightHandle",
    "WeightStore",
    "WeightTransport",
    "WeightVersionError",
    "cast_floating",
    "checked_destination",
    "copy_into",
    "dtype_from_name",
    "dtype_name",
]


@dataclass(frozen=True)
class TensorMeta:
    """Where one parameter lives inside a pushed version. ``dtype`` is a torch name."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightHandle:
    """Picklable description of one pushed version: enough to pull it in another process.

    ``transport`` is a ``forge.weights.registry.TRANSPORTS`` name; ``location`` is
    transport-specific (the shm file path, the version directory); ``manifest`` maps each HF
    parameter name to its :class:`TensorMeta`, in push order. ``source`` and ``uid`` let a
    puller on another host copy the version to its own host (``forge.weights.relay``).
    """

    version: int
    transport: str
    location: str
    manifest: dict[str, TensorMeta] = field(default_factory=dict)
    # Where a puller on another host fetches ``location`` from: the pushing worker's TCP
    # address ("" when it is only reachable on its host), and an id of this push (a version
    # number is pushed again after a restart from a checkpoint, with other bytes).
    source: str = ""
    uid: str = ""

    @property
    def is_adapter(self) -> bool:
        """Whether this version holds LoRA adapter tensors (``forge.weights.adapter``)."""
        return ADAPTER_KEY in self.manifest

    @property
    def nbytes(self) -> int:
        """Bytes stored: tied names that share one offset count once."""
        stored = {meta.offset: meta.nbytes for meta in self.manifest.values() if meta.nbytes}
        return sum(stored.values())


class WeightVersionError(KeyError):
    """A version that cannot be pulled: never pushed, or already dropped."""

    def __str__(self) -> str:
        # KeyError's default str() wraps the message in quotes; show it as written.
        return str(self.args[0]) if self.args else ""


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; ``ValueError`` for anything else."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name (expected e.g. 'bfloat16')")
    return dtype


def copy_into(into: dict[str, torch.Tensor], name: str, src: torch.Tensor, source: str) -> None:
    """``into[name].copy_(src)`` after checking the destination exists with the same layout.

    ``copy_`` would silently cast dtypes and broadcast shapes; a mismatch here means the
    generator's model is not the trainer's, so it is an error naming the parameter.
    """
    checked_destination(into, name, src, source).copy_(src)


def checked_destination(
    into: dict[str, torch.Tensor], name: str, src: torch.Tensor, source: str
) -> torch.Tensor:
    """``into[name]``, checked to exist with ``src``'s dtype and shape (see :func:`copy_into`)."""
    dst = into.get(name)
    if dst is None:
        raise ValueError(
            f"{source} has parameter {name!r} but the `into` dict has no such "
            "key; pass the receiving model's state_dict() (HF parameter names)"
        )
    if dst.dtype != src.dtype or dst.shape != src.shape:
        raise ValueError(
            f"{source}: parameter {name!r} is {dtype_name(src.dtype)}"
            f"{list(src.shape)} but the destination is {dtype_name(dst.dtype)}{list(dst.shape)}"
        )
    return dst


def check_into_keys(into: dict[str, torch.Tensor], names: list[str], source: str) -> None:
    """Reject an ``into`` dict with parameters the version lacks (they would stay stale)."""
    extra = sorted(set(into) - set(names))
    if extra:
        raise ValueError(
            f"{source} has no parameter(s) {extra[:5]} present in `into` "
            f"({len(extra)} in all); they would keep stale values. Pass only pushed names"
        )


class WeightTransport:
    """Moves state dicts between processes. Implementations live in sibling files."""

    name: str = ""

    def push(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        """Publish ``state_dict`` as ``version``; the caller may modify it right after."""
        raise NotImplementedError

    def pull(
        self,
        handle_or_version: WeightHandle | int,
        into: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Read a version: copied into ``into``'s tensors (returned) or into fresh tensors."""
        raise NotImplementedError

    def drop(self, version: int) -> None:
        """Free a version's storage. Dropping a version that is already gone is a no-op."""
        raise NotImplementedError

    def versions(self) -> list[int]:
        """Versions currently stored, ascending."""
        raise NotImplementedError

    def close(self) -> None:
        """Free everything this transport pushed."""


class WeightStore:
    """Registry of pushed versions over a transport, with ``keep_last`` retention.

    Lives with the pusher (the trainer or a weight-store actor). Versions must increase.
    After each push, versions older than the newest ``keep_last`` are dropped.
    """

    def __init__(self, transport: WeightTransport, keep_last: int = 2) -> None:
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"WeightStore keep_last must be an int >= 1, got {keep_last!r}")
        self.transport = transport
        self.keep_last = keep_last
        self._handles: dict[int, WeightHandle] = {}
        # version -> why it is gone, for the error message of a late pull.
        self._dropped: dict[int, str] = {}

    def push(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightHandle:
        """Publish ``version`` and apply retention; returns the handle to send to pullers."""
        latest = self.latest()
        if latest is not None and version <= latest:
            raise ValueError(
                f"weight version {version} is not newer than the latest pushed version "
                f"{latest}; versions must increase"
            )
        handle = self.transport.push(state_dict, version)
        self._handles[version] = handle
        for old in sorted(self._handles)[: -self.keep_last]:
            self._drop(old, f"by the retention policy (keep_last={self.keep_last})")
        return handle

    def latest(self) -> int | None:
        """Newest available version, or ``None`` before the first push."""
        return max(self._handles) if self._handles else None

    def versions(self) -> list[int]:
        """Available versions, ascending."""
        return sorted(self._handles)

    def handle(self, version: int | None = None) -> WeightHandle:
        """Handle of ``version`` (default: latest), to pull it in another process."""
        if version is None:
            version = self.latest()
            if version is None:
                raise WeightVersionError("no weight version was pushed yet; push one first")
        if version not in self._handles:
            known = self.versions()
            if version in self._dropped:
                raise WeightVersionError(
                    f"weight version {version} was dropped {self._dropped[version]}; "
                    f"available: {known}"
                )
            raise WeightVersionError(f"weight version {version} was never pushed (known: {known})")
        return self._handles[version]

    def pull(
        self, version: int | None = None, into: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Read ``version`` (default: latest) into ``into`` or into fresh tensors."""
        return self.transport.pull(self.handle(version), into=into)

    def drop(self, version: int) -> None:
        """Free ``version`` now; later pulls of it say it was dropped."""
        self._drop(version, "explicitly with WeightStore.drop()")

    def _drop(self, version: int, reason: str) -> None:
        if self._handles.pop(version, None) is not None:
            self.transport.drop(version)
            self._dropped[version] = reason

    def close(self) -> None:
        """Drop every version and close the transport."""
        for version in self.versions():
            self.drop(version)
        self.transport.close()


def cast_floating(state_dict: dict[str, torch.Tensor], dtype: str) -> dict[str, torch.Tensor]:
    """``state_dict`` with its floating-point tensors in ``dtype`` (``""``: unchanged). Tensors
    that share storage (tied weights) stay shared, so a transport still writes them once."""
    if not dtype:
        return state_dict
    target = getattr(torch, dtype)
    cast: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, t in state_dict.items():
        if not t.is_floating_point() or t.dtype == target:
            out[name] = t
            continue
        key = (t.device, t.data_ptr(), tuple(t.shape), t.stride())
        if key not in cast:
            cast[key] = t.detach().to(target)
        out[name] = cast[key]
    return out
