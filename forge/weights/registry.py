"""The weight transports by name: how the pusher and its pullers build the same transport.

``TRANSPORTS`` maps a ``WeightTransportConfig.type`` to its entry: how to build the
transport from the config (:func:`build_transport`, used by the trainer to push and by
generators and reference models to pull by version number), how to read a pushed
``WeightHandle`` in any process (:func:`pull_handle`), and which config fields are its own
(``WeightTransportConfig`` rejects another transport's field as an ignored knob). A new
transport is a sibling file with a ``WeightTransport`` subclass plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from forge.weights.broadcast import BroadcastTransport, read_broadcast
from forge.weights.pull import run_weights_prefix
from forge.weights.relay import localize_sync
from forge.weights.safetensors_dir import SafetensorsDirTransport, read_safetensors_dir
from forge.weights.shm import SharedMemoryTransport, read_shm_file
from forge.weights.store import WeightHandle, WeightTransport

__all__ = ["TRANSPORTS", "TransportEntry", "build_transport", "pull_handle"]

StateDict = dict[str, torch.Tensor]
# A ``forge.weights.transport_config.WeightTransportConfig``; not imported, since that module
# imports this one to check its ``type`` and knobs.
TransportConfig = Any


@dataclass(frozen=True)
class TransportEntry:
    """One transport: ``build(config)``, ``read(handle, into)``, and ``knobs``, the
    ``WeightTransportConfig`` fields that only this transport reads."""

    build: Callable[[TransportConfig], WeightTransport]
    read: Callable[[WeightHandle, StateDict | None], StateDict]
    knobs: tuple[str, ...]


def _build_shm(cfg: TransportConfig) -> WeightTransport:
    # No prefix: the run's publication location, where pushes and pulls meet by default.
    prefix = cfg.prefix or run_weights_prefix()
    return SharedMemoryTransport(prefix, shm_dir=cfg.shm_dir, wait_s=cfg.wait_s, spares=cfg.spares)


def _read_shm(handle: WeightHandle, into: StateDict | None) -> StateDict:
    handle = localize_sync(handle)  # pushed on another host: copied to this one first
    return read_shm_file(handle.location, handle.version, handle.manifest, into)


def _build_safetensors_dir(cfg: TransportConfig) -> WeightTransport:
    return SafetensorsDirTransport(cfg.root, wait_s=cfg.wait_s)


def _read_safetensors_dir(handle: WeightHandle, into: StateDict | None) -> StateDict:
    return read_safetensors_dir(handle.location, handle.version, into)


def _build_broadcast(cfg: TransportConfig) -> WeightTransport:
    return BroadcastTransport(cfg.backend)


TRANSPORTS: dict[str, TransportEntry] = {
    "shm": TransportEntry(_build_shm, _read_shm, ("prefix", "shm_dir", "spares", "share")),
    "safetensors_dir": TransportEntry(_build_safetensors_dir, _read_safetensors_dir, ("root",)),
    "broadcast": TransportEntry(_build_broadcast, read_broadcast, ("backend",)),
}


def build_transport(cfg: TransportConfig) -> WeightTransport:
    """The transport ``cfg.type`` names, configured by ``cfg`` (pusher and pullers alike)."""
    return TRANSPORTS[cfg.type].build(cfg)


def pull_handle(handle: WeightHandle, into: StateDict | None = None) -> StateDict:
    """Pull ``handle`` in any process, with no transport object configured there."""
    entry = TRANSPORTS.get(handle.transport)
    if entry is None:
        raise ValueError(
            f"weight handle for version {handle.version} has unknown transport "
            f"{handle.transport!r}; choose one of {sorted(TRANSPORTS)}"
        )
    return entry.read(handle, into)
