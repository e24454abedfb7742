"""The trainer's HF transformers backend: ``HFAdapter``, the model ``TrainerCore``
(``forge.training.trainer_core``) trains when ``backend: hf``.

The adapter loads the model (with LoRA adapters, gradient checkpointing and the thread
budget's per-layer hooks as configured), computes per-token logprobs (the memory-saving
chunked head on one rank; through the wrapper's own ``forward`` under DDP/FSDP) and keeps HF
names as the native names. ``forge.training.titan`` is the other backend, with the same
interface.
"""

from __future__ import annotations

import re

import torch

from controller import threads
from forge.models import gather_logprobs, position_ids_from_mask, token_logprobs
from forge.models.logprobs import effective_temperature
from forge.training import parallel
from forge.training.trainer_config import TrainerConfig

__all__ = ["HFAdapter", "rebalance_per_layer", "wrapped_logprobs"]


def wrapped_logprobs(
    model: torch.nn.Module,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``token_logprobs`` through the wrapper's own ``forward`` (DDP and FSDP2 hook into it,
    so the body/head split that ``token_logprobs`` uses to save memory would bypass them)."""
    position_ids_bt = position_ids_from_mask(attention_mask_bt)
    logits_btv = model(
        input_ids=input_ids_bt, attention_mask=attention_mask_bt, position_ids=position_ids_bt
    ).logits[:, :-1]
    lp_bt = gather_logprobs(
        logits_btv.float() / effective_temperature(temperature), input_ids_bt[:, 1:]
    )
    lp_bt = torch.cat([lp_bt.new_zeros(lp_bt.shape[0], 1), lp_bt], dim=1)
    valid_bt = attention_mask_bt.bool().clone()
    valid_bt[:, 1:] &= attention_mask_bt[:, :-1].bool()
    valid_bt[:, 0] = False
    return torch.where(valid_bt, lp_bt, torch.zeros_like(lp_bt))


class HFAdapter:
    """Backend adapter for transformers models: HF names are already the native names."""

    name = "hf"

    def __init__(self, cfg: TrainerConfig, device: str) -> None:
        from forge.training import lora

        # (An exported LoRA policy, an adapter directory, loads as its merged model.)
        self.model = lora.load_base_model(cfg.model, cfg.dtype, device, cfg.attn_implementation)
        self.peft = None  # with cfg.lora: the PeftModel around self.model (adapters in place)
        if cfg.lora is not None:
            self.peft = lora.wrap_with_lora(self.model, cfg.lora, lora.base_name(cfg.model))
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
            if self.peft is not None:  # frozen embeddings: checkpointed blocks need grad inputs
                self.model.enable_input_require_grads()
        rebalance_per_layer(self.model)

    def logprobs(self, model, input_ids_bt, attention_mask_bt, temperature: float) -> torch.Tensor:
        if parallel.rank_and_world()[1] == 1:  # unwrapped: the memory-saving chunked head
            return token_logprobs(model, input_ids_bt, attention_mask_bt, temperature)
        return wrapped_logprobs(model, input_ids_bt, attention_mask_bt, temperature)

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state_dict

    def from_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return state_dict

    def save_config(self, path) -> None:
        self.model.config.save_pretrained(path)


_LAYER_NAME = re.compile(r"(.*\.)?(layers|h|blocks)\.\d+")


def rebalance_per_layer(model: torch.nn.Module) -> int:
    """With the host thread budget on, re-read this process's share of the cores at every
    decoder layer, in the forward pass and (through a gradient hook on the layer's output) in
    the backward pass, so cores a neighbour frees are used within a layer's time rather than
    at the next pass. Returns how many layers got hooks (0 with the budget off)."""
    budget = threads.get_budget()
    if not budget.enabled:
        return 0

    def on_grad(grad):
        budget.rebalance()

    def before(module, args):
        budget.rebalance()

    def after(module, args, output):
        out = output[0] if isinstance(output, (tuple, list)) else output
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(on_grad)

    layers = [m for name, m in model.named_modules() if _LAYER_NAME.fullmatch(name)]
    for layer in layers:
        layer.register_forward_pre_hook(before)
        layer.register_forward_hook(after)
    return len(layers)
