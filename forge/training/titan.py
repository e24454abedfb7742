"""The torchtitan backend: train torchtitan's model definitions, speak HF names outside.

``TrainerConfig(backend="titan")`` builds torchtitan's Llama3 ``Decoder`` from the HF
config of ``cfg.model`` (a Llama-architecture directory, e.g. ``make_tiny_model(p,
preset="llama")``), loads the HF weights through torchtitan's ``Llama3StateDictAdapter``
(which also undoes HF's rotary permutation of q/k), and hands the trainer core an adapter
with the same interface as ``HFAdapter``: ``logprobs``, ``to_hf`` / ``from_hf`` (so
``push_weights`` publishes HF names that any HF or vLLM generator loads), ``save_config``.

Where it departs from torchtitan's own ``Trainer`` (CUDA-only, FlexAttention):

* attention is ``ScaledDotProductAttention`` with ``is_causal=True`` instead of FlexAttention,
  which has no CPU backward. Forge batches are right-padded, so causal attention without a
  padding mask gives real tokens exactly the context they would have, and padded positions
  are masked out of every loss;
* parallelism is Forge's own DDP/FSDP2 wrapping (``forge.training.parallel``), not
  torchtitan's ``parallelize_llama``.

torchtitan 0.3.0 imports ``triton`` in its model packages; both are imported here, lazily,
and a missing one raises ``ImportError`` naming ``pip install 'forge[titan]'``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from forge.models import gather_logprobs, load_model
from forge.models.logprobs import effective_temperature

__all__ = ["TitanAdapter", "build_titan_llama", "import_titan", "titan_llama_config"]

SUPPORTED_MODEL_TYPES = ("llama",)


def import_titan() -> SimpleNamespace:
    """torchtitan's pieces this backend uses, or ImportError naming the extra to install."""
    try:
        from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
        from torchtitan.models.common.attention import ScaledDotProductAttention
        from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
        from torchtitan.models.llama3 import Llama3Model, Llama3StateDictAdapter
        from torchtitan.models.llama3.model import Llama3TransformerBlock
    except ImportError as e:
        raise ImportError(
            f"the titan trainer backend needs torchtitan==0.3.0 (and triton, which its models "
            f"import): pip install 'forge[titan]' ({e})"
        ) from e
    return SimpleNamespace(
        ComplexRoPE=ComplexRoPE,
        Embedding=Embedding,
        Linear=Linear,
        RMSNorm=RMSNorm,
        ScaledDotProductAttention=ScaledDotProductAttention,
        make_ffn_config=make_ffn_config,
        make_gqa_config=make_gqa_config,
        Llama3Model=Llama3Model,
        Llama3StateDictAdapter=Llama3StateDictAdapter,
        Llama3TransformerBlock=Llama3TransformerBlock,
    )


def titan_llama_config(hf_config) -> Any:
    """A torchtitan ``Llama3Model.Config`` with the shapes of an HF ``LlamaConfig`` and SDPA."""
    t = import_titan()
    if hf_config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"the titan backend supports HF model types {SUPPORTED_MODEL_TYPES}, got "
            f"{hf_config.model_type!r}; use backend='hf' for this model"
        )
    dim, n_heads = hf_config.hidden_size, hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or dim // n_heads
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise ValueError("the titan llama3 model has no attention/MLP biases; use backend='hf'")
    theta = (getattr(hf_config, "rope_parameters", None) or {}).get("rope_theta") or getattr(
        hf_config, "rope_theta", 10000.0
    )
    keep = {"weight": lambda w: None}  # weights come from the HF checkpoint, not init
    norm = t.RMSNorm.Config(normalized_shape=dim, eps=hf_config.rms_norm_eps, param_init=keep)
    rope = t.ComplexRoPE.Config(
        dim=head_dim, max_seq_len=hf_config.max_position_embeddings, theta=float(theta)
    )
    layers = [
        t.Llama3TransformerBlock.Config(
            attention_norm=norm,
            ffn_norm=norm,
            attention=t.make_gqa_config(
                dim=dim,
                n_heads=n_heads,
                n_kv_heads=hf_config.num_key_value_heads,
                head_dim=head_dim,
                wqkv_param_init=keep,
                wo_param_init=keep,
                inner_attention=t.ScaledDotProductAttention.Config(),
                rope=rope,
                fuse_qkv=False,  # separate wq/wk/wv: the names the HF adapter maps
            ),
            feed_forward=t.make_ffn_config(
                dim=dim,
                hidden_dim=hf_config.intermediate_size,
                w1_param_init=keep,
                w2w3_param_init=keep,
            ),
        )
        for _ in range(hf_config.num_hidden_layers)
    ]
    vocab = hf_config.vocab_size
    return t.Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        tok_embeddings=t.Embedding.Config(num_embeddings=vocab, embedding_dim=dim, param_init=keep),
        norm=norm,
        lm_head=t.Linear.Config(in_features=dim, out_features=vocab, param_init=keep),
        layers=layers,
        enable_weight_tying=bool(getattr(hf_config, "tie_word_embeddings", False)),
    )


def build_titan_llama(hf_model) -> tuple[torch.nn.Module, Any]:
    """``(titan model with hf_model's weights, state-dict adapter)``; float32, CPU."""
    t = import_titan()
    config = titan_llama_config(hf_model.config)
    model = config.build()
    adapter = t.Llama3StateDictAdapter(config, None)
    native = adapter.from_hf(dict(hf_model.state_dict()))
    missing, unexpected = model.load_state_dict(native, strict=False)
    # Only rotary caches (derived buffers) may be absent from an HF checkpoint.
    missing = [k for k in missing if "rope" not in k]
    if missing or unexpected:
        raise ValueError(
            f"HF -> titan weights mismatch: missing {missing}, unexpected {unexpected}"
        )
    dtype = next(hf_model.parameters()).dtype
    for param in model.parameters():  # not model.to(dtype): the rotary cache is complex
        param.data = param.data.to(dtype)
    return model, adapter


class TitanAdapter:
    """Backend adapter of ``TrainerCore`` for torchtitan models (see module docstring)."""

    name = "titan"

    def __init__(self, cfg, device: str) -> None:
        hf_model = load_model(cfg.model, cfg.dtype, "cpu", cfg.attn_implementation)
        self.hf_config = hf_model.config
        self.model, self.sd_adapter = build_titan_llama(hf_model)
        self.model.to(device)
        del hf_model

    def logprobs(self, model, input_ids_bt, attention_mask_bt, temperature: float) -> torch.Tensor:
        mask_bt = attention_mask_bt.bool()
        # Right padding: every row's mask is ones then zeros (causal attention needs no mask).
        if (mask_bt[:, 1:] & ~mask_bt[:, :-1]).any():
            raise ValueError("the titan backend needs right-padded batches (collate_episodes)")
        logits_btv = model(input_ids_bt)[:, :-1]
        temp = effective_temperature(temperature)
        lp_bt = gather_logprobs(logits_btv.float() / temp, input_ids_bt[:, 1:])
        lp_bt = torch.cat([lp_bt.new_zeros(lp_bt.shape[0], 1), lp_bt], dim=1)
        valid_bt = mask_bt.clone()
        valid_bt[:, 0] = False
        return torch.where(valid_bt, lp_bt, torch.zeros_like(lp_bt))

    def to_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """HF names (and HF's q/k layout); a tied ``lm_head.weight`` is listed too, as in an
        HF model's own ``state_dict()``, so pullers can load it into one."""
        hf = self.sd_adapter.to_hf(dict(state_dict))
        if self.hf_config.tie_word_embeddings and "lm_head.weight" not in hf:
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        return hf

    def from_hf(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.sd_adapter.from_hf(dict(state_dict))

    def save_config(self, path) -> None:
        self.hf_config.save_pretrained(path)
