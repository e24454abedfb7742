"""A pushed version that holds LoRA adapter tensors instead of full weights.

With ``trainer.lora`` the trainer pushes only the adapter: PEFT's own adapter state-dict
keys (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``, ``[rank, in]``;
``...lora_B.weight``, ``[out, rank]``) plus one small ``uint8`` tensor under
:data:`ADAPTER_KEY` holding an :class:`AdapterSpec` as JSON: which base model the adapter
belongs to, its rank, alpha and target modules. The version is then self-describing through
every transport and every way of pulling it (a handle, or a version number after a restart),
and any transport moves it unchanged. ``WeightHandle.is_adapter`` tells from the manifest.

A generator given such a version applies it to the base model it already holds
(``forge.training.lora.LoraApplier``) instead of loading it as full weights.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

import torch

__all__ = [
    "ADAPTER_KEY",
    "LORA_MODES",
    "AdapterSpec",
    "adapter_key_parts",
    "pack_adapter",
    "unpack_adapter",
]

ADAPTER_KEY = "__lora_adapter__"
LORA_MODES = ("merged", "unmerged")  # how a generator applies one (forge.training.lora)
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$"
)


@dataclass(frozen=True)
class AdapterSpec:
    """What a pushed adapter is: for ``base_model`` (the trainer's ``model`` as configured:
    the policy's model, which its generators name too), with ``rank``,
    ``alpha`` (the update is ``B @ A * alpha / rank``) and ``target_modules``."""

    base_model: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor(list(json.dumps(asdict(self)).encode()), dtype=torch.uint8)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> AdapterSpec:
        d = json.loads(bytes(t.to("cpu").tolist()).decode())
        return cls(d["base_model"], int(d["rank"]), float(d["alpha"]), tuple(d["target_modules"]))


def pack_adapter(tensors: dict[str, torch.Tensor], spec: AdapterSpec) -> dict[str, torch.Tensor]:
    """The state dict to push: the adapter tensors plus the spec under ``ADAPTER_KEY``."""
    return {**tensors, ADAPTER_KEY: spec.to_tensor()}


def unpack_adapter(
    state_dict: dict[str, torch.Tensor],
) -> tuple[AdapterSpec, dict[str, torch.Tensor]] | None:
    """``(spec, adapter tensors)`` of a pushed adapter version, ``None`` for full weights."""
    if ADAPTER_KEY not in state_dict:
        return None
    rest = {k: v for k, v in state_dict.items() if k != ADAPTER_KEY}
    return AdapterSpec.from_tensor(state_dict[ADAPTER_KEY]), rest


def adapter_key_parts(key: str) -> tuple[str, str]:
    """``(module path in the HF model, "A" or "B")`` of an adapter tensor's key (PEFT's
    ``base_model.model.<path>.lora_A.weight``, with or without the adapter's name)."""
    m = _KEY.match(key)
    if m is None:
        raise ValueError(
            f"{key!r} is not a LoRA adapter tensor name (expected '<module>.lora_A.weight' or "
            "'<module>.lora_B.weight', as PEFT's get_peft_model_state_dict writes them)"
        )
    return m["module"], m["ab"]
