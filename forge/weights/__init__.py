"""Versioned weights from trainer to generators: a registry plus pluggable transports.

Importing this package does not import ``torch.distributed`` collectives' backends or touch
``/dev/shm``; transports act only when called.
"""

from forge.weights.dist import broadcast_state_dict, plan_buckets
from forge.weights.safetensors_dir import SafetensorsDirTransport
from forge.weights.shm import SharedMemoryTransport
from forge.weights.store import (
    TRANSPORTS,
    TensorMeta,
    WeightHandle,
    WeightStore,
    WeightTransport,
    WeightVersionError,
    build_weight_transport,
    pull_handle,
)

__all__ = [
    "TRANSPORTS",
    "SafetensorsDirTransport",
    "SharedMemoryTransport",
    "TensorMeta",
    "WeightHandle",
    "WeightStore",
    "WeightTransport",
    "WeightVersionError",
    "broadcast_state_dict",
    "build_weight_transport",
    "plan_buckets",
    "pull_handle",
]
