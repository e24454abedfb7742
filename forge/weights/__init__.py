"""Versioned weights from trainer to generators: a registry plus pluggable transports.

``WeightTransportConfig`` (one config for pusher and pullers) names a transport of the
registry (``TRANSPORTS``), which ``build_transport`` builds on either side.
``WeightStore`` (pusher side) keeps versions and retention; ``SharedMemoryTransport`` (same
host) and ``SafetensorsDirTransport`` (shared filesystem) move the bytes; ``pull_handle`` pulls
a picklable ``WeightHandle`` in any process (``lease_shm_file``: a same-host version's
tensors in place, read-only, with no copy); ``broadcast_state_dict`` sends weights over
an existing ``torch.distributed`` group. Importing touches no file and no process group.
"""

from forge.weights.adapter import ADAPTER_KEY, AdapterSpec, pack_adapter, unpack_adapter
from forge.weights.dist import broadcast_state_dict, plan_buckets
from forge.weights.pull import run_weights_prefix
from forge.weights.registry import TRANSPORTS, build_transport, pull_handle
from forge.weights.safetensors_dir import SafetensorsDirTransport
from forge.weights.shm import SharedMemoryTransport, ShmLease, lease_shm_file
from forge.weights.store import (
    TensorMeta,
    WeightHandle,
    WeightStore,
    WeightTransport,
    WeightVersionError,
)
from forge.weights.transport_config import WeightTransportConfig

__all__ = [
    "ADAPTER_KEY",
    "AdapterSpec",
    "TRANSPORTS",
    "SafetensorsDirTransport",
    "SharedMemoryTransport",
    "ShmLease",
    "TensorMeta",
    "WeightHandle",
    "WeightStore",
    "WeightTransport",
    "WeightTransportConfig",
    "WeightVersionError",
    "broadcast_state_dict",
    "build_transport",
    "lease_shm_file",
    "pack_adapter",
    "plan_buckets",
    "pull_handle",
    "run_weights_prefix",
    "unpack_adapter",
]
