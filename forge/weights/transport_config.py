"""``WeightTransportConfig``: where pushed policy versions live, one config for both sides.

The trainer pushes through it (``TrainerConfig.weights``); generators and reference models
pull through it (``GeneratorConfig.weights``, ``ReferenceConfig.weights``): the same type on
every side, so one ``weights:`` section can flow to every role, and both sides build their
transport with the same ``forge.weights.registry.build_transport``::

    weights: {type: shm}                                   # default: same host, /dev/shm
    weights: {type: safetensors_dir, root: /shared/run1}   # a filesystem every host reads
    weights: {type: broadcast}                             # one NCCL (GPU) / gloo broadcast
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from forge.weights.registry import TRANSPORTS

__all__ = ["WeightTransportConfig"]


@dataclass
class WeightTransportConfig:
    """The weight transport and its knobs. A field of another transport set to a non-default
    value is a ``ValueError``: that transport would ignore it."""

    type: str = "shm"
    """``shm`` (one file per version under ``shm_dir``, copied once per host to other
    hosts), ``safetensors_dir`` (``<root>/v<version>`` on a shared filesystem) or
    ``broadcast`` (the trainer sends each version to every generator replica in a broadcast
    group; ``forge.weights.broadcast`` says what it cannot do)."""
    prefix: str = ""
    """shm: names the files (``forge-w-<prefix>-v<version>-<random>``). Empty: the run's
    publication location (``forge.weights.pull.run_weights_prefix``), where a trainer pushes
    and generators and reference models look by default, so a restarted replica finds the
    latest version by itself; a trainer starting there drops the versions a previous
    trainer of the session left. Two trainers pushing at once in one session need a prefix
    each."""
    shm_dir: str = "/dev/shm"
    """shm: a RAM-backed directory."""
    spares: int = 1
    """shm, pusher: files of dropped versions kept for later pushes to rewrite (warm pages);
    each holds one version's bytes. 0 unlinks at once."""
    share: bool = True
    """shm, puller (hf backend on CPU, handles whose dtypes match the model): compute with
    the pushed file's bytes in place, read-only, instead of copying them, so the replicas of
    a host hold one copy of a version and a pull copies nothing."""
    root: str = ""
    """safetensors_dir: the directory (required with that type)."""
    keep_last: int = 2
    """Pusher: versions kept before older ones are dropped (at least 1, so the latest is
    always there for a restarted replica)."""
    wait_s: float = 0.0
    """Puller: how long pulling a version by number waits for it to appear."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """broadcast: ``auto`` (``nccl`` where CUDA is available, else ``gloo``), ``nccl`` or
    ``gloo``."""
    dtype: Literal["", "bfloat16", "float16", "float32", "auto"] = ""
    """Pusher: floating-point tensors are pushed in this type (``""``: as the trainer holds
    them; ``auto``: ``bfloat16`` where the trainer's device multiplies bf16 natively, else as
    held, decided by ``TrainerConfig``). ``bfloat16`` where every puller computes in bf16 halves the bytes of each push, and
    pullers whose model is bf16 then compute with the pushed bytes in place (``share``); the
    values they hold are the same, since they round to bf16 either way."""

    def __post_init__(self) -> None:
        entry = TRANSPORTS.get(self.type)
        if entry is None:
            hint = (
                f" (for an {self.type} broadcast: type: broadcast, backend: {self.type})"
                if self.type in ("nccl", "gloo")
                else ""
            )
            raise ValueError(
                f"unknown weight transport type {self.type!r}; choose one of "
                f"{sorted(TRANSPORTS)}{hint}"
            )
        for f in dataclasses.fields(self):
            owners = [t for t, e in TRANSPORTS.items() if f.name in e.knobs]
            if owners and self.type not in owners and getattr(self, f.name) != f.default:
                raise ValueError(
                    f"WeightTransportConfig.{f.name}={getattr(self, f.name)!r} applies to type "
                    f"{' or '.join(map(repr, owners))} only; the {self.type!r} transport would "
                    f"ignore it: remove it or set type: {owners[0]}"
                )
        if self.type == "safetensors_dir" and not self.root:
            raise ValueError(
                "WeightTransportConfig.type='safetensors_dir' needs root (a directory on a "
                "filesystem the trainer writes and every puller reads)"
            )
        if not isinstance(self.keep_last, int) or self.keep_last < 1:
            raise ValueError(
                f"WeightTransportConfig.keep_last must be >= 1, got {self.keep_last!r}"
            )
        if not isinstance(self.spares, int) or self.spares < 0:
            raise ValueError(f"WeightTransportConfig.spares must be >= 0, got {self.spares!r}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ValueError(
                f"WeightTransportConfig.backend must be auto, gloo or nccl, got {self.backend!r}"
            )
        if self.type == "broadcast" and self.wait_s:
            raise ValueError(
                "WeightTransportConfig.wait_s applies to versions pulled by number; "
                "type broadcast has none (the weight sync sends each version)"
            )
        if self.wait_s < 0:
            raise ValueError(f"WeightTransportConfig.wait_s must be >= 0, got {self.wait_s!r}")
