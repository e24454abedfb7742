"""LoRA with PEFT: wrapping the trainer's model, and applying pushed adapters elsewhere.

Trainer side: :func:`wrap_with_lora` injects PEFT LoRA layers into a transformers model in
place (the model object keeps working and now computes ``W x + B A x * alpha / rank``),
freezes every base parameter and returns the ``PeftModel`` (for ``disable_adapter``, the
adapter state dict and ``save_pretrained``). :func:`adapter_tensors` is what a push, a
checkpoint and an export carry.

Generator side: :class:`LoraApplier` turns a pushed adapter into the tensors to load into
the generator's model without reloading the base, in one of two ways
(``GeneratorConfig.lora_mode``):

* ``unmerged``: the model gets the same LoRA layers once (zero update at first); each
  version then only rewrites the ``lora_A``/``lora_B`` tensors;
* ``merged``: a copy of the base weights of the targeted layers is kept once; each version
  writes ``W0 + B @ A * scale`` into them (no extra matmuls while generating).

Either way the result is a name -> tensor dict covering the whole model whose untouched
entries are the model's own tensors, so the backend's usual update paths (in place, or a new
lane for in-flight requests) load it and skip the tensors that did not change.

:func:`load_base_model` loads a model directory or a saved adapter directory (an export of a
LoRA run: ``adapter_config.json`` naming its base), merged into a plain model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from forge.training.trainer_config import DEFAULT_LORA_TARGETS, LoraConfig
from forge.weights.adapter import LORA_MODES, AdapterSpec, adapter_key_parts

__all__ = [
    "LORA_MODES",
    "LoraApplier",
    "adapter_tensors",
    "base_name",
    "delta_weight",
    "is_adapter_dir",
    "linear_names",
    "load_base_model",
    "merged_hf_state_dict",
    "merged_state_dict",
    "tokenizer_source",
    "wrap_with_lora",
]

ADAPTER_CONFIG = "adapter_config.json"


def base_name(model: str) -> str:
    """What an adapter records as its base: an absolute path for a local model, else the id."""
    from forge.models import local_source

    source = local_source(model)
    return str(Path(source).resolve()) if Path(source).exists() else source


def import_peft():
    """The ``peft`` package, or ImportError naming the extra to install."""
    try:
        import peft
    except ImportError as e:
        raise ImportError(
            "trainer.lora needs the peft package: pip install 'forge[lora]' (or pip install peft)"
        ) from e
    return peft


def linear_names(model: torch.nn.Module) -> list[str]:
    """Leaf names of the model's linear layers (what ``target_modules`` may name)."""
    return sorted(
        {n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    )


def _peft_config(targets: tuple[str, ...], rank: int, alpha: float, dropout: float, base: str):
    peft = import_peft()
    return peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(targets),
        base_model_name_or_path=base,
        bias="none",
    )


def default_targets(model: torch.nn.Module) -> tuple[str, ...]:
    """``DEFAULT_LORA_TARGETS`` where the model has them all, else the leaf names of its
    linear layers except the output head's."""
    have = linear_names(model)
    if all(t in have for t in DEFAULT_LORA_TARGETS):
        return DEFAULT_LORA_TARGETS
    head = model.get_output_embeddings()
    heads = {n.rpartition(".")[2] for n, m in model.named_modules() if m is head}
    return tuple(n for n in have if n not in heads)


def check_targets(model: torch.nn.Module, targets: tuple[str, ...], where: str) -> None:
    """``ValueError`` naming the model's linear layers if a target is not one of them."""
    have = linear_names(model)
    unknown = [t for t in targets if t not in have]
    if unknown:
        raise ValueError(
            f"{where}: target_modules {unknown} are not linear layers of this model; its "
            f"linear layers are {have}"
        )


def wrap_with_lora(model: torch.nn.Module, cfg: LoraConfig, base: str):
    """Inject LoRA layers into ``model`` (in place) and freeze its base; returns the
    ``PeftModel`` around it. ``base``: the base model's path or id, recorded in exports.
    With the default ``target_modules`` on a model that lacks some of those names (Phi-3's
    fused ``qkv_proj`` and ``gate_up_proj``), ``cfg.target_modules`` becomes every linear
    layer but the output head, so pushes and exports name what was adapted."""
    if cfg.target_modules == DEFAULT_LORA_TARGETS:
        cfg.target_modules = default_targets(model)
    check_targets(model, cfg.target_modules, "trainer.lora")
    peft = import_peft()
    config = _peft_config(cfg.target_modules, cfg.rank, cfg.alpha, cfg.dropout, base)
    # PEFT records the model's own name_or_path as the base; a model merged from an adapter
    # directory reports the first base of the chain, so state ours (what exports load).
    model.name_or_path = base
    wrapped = peft.get_peft_model(model, config)
    wrapped.peft_config["default"].base_model_name_or_path = base
    return wrapped


def adapter_tensors(peft_model) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's stable keys (``...q_proj.lora_A.weight``); an
    adapted ``lm_head`` contributes its A and B only, not its (frozen, maybe tied) base."""
    peft = import_peft()
    return dict(peft.get_peft_model_state_dict(peft_model, save_embedding_layers=False))


def delta_weight(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``B @ A * scaling`` in float32, the update a LoRA layer adds to its base weight."""
    return (b.float() @ a.float()) * scaling


def _pairs(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """``module path -> {"A": tensor, "B": tensor}``."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        module, ab = adapter_key_parts(key)
        out.setdefault(module, {})[ab] = t
    missing = sorted(m for m, d in out.items() if len(d) != 2)
    if missing:
        raise ValueError(f"adapter tensors lack lora_A or lora_B for {missing[:3]}")
    return out


def merged_state_dict(
    base: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], scaling: float
) -> dict[str, torch.Tensor]:
    """``<module>.weight -> W0 + B @ A * scaling`` for every adapted module, ``W0`` from
    ``base`` (HF names), in ``W0``'s dtype."""
    out = {}
    for module, ab in _pairs(tensors).items():
        w0 = base[f"{module}.weight"]
        d = delta_weight(ab["A"].to(w0.device), ab["B"].to(w0.device), scaling)
        out[f"{module}.weight"] = (w0.float() + d).to(w0.dtype)
    return out


def merged_hf_state_dict(
    peft_state: dict[str, torch.Tensor], scaling: float
) -> dict[str, torch.Tensor]:
    """HF-named weights of a model with LoRA layers injected (its ``state_dict()``), with
    each adapter merged into its base weight (the model itself is left unchanged)."""
    base = {k.replace(".base_layer.", "."): v for k, v in peft_state.items() if ".lora_" not in k}
    lora = {k: v for k, v in peft_state.items() if ".lora_" in k}
    return {**base, **merged_state_dict(base, lora, scaling)}


class LoraApplier:
    """Applies pushed adapters to one generator's model (see the module docstring).

    ``state_dict_for(model, spec, tensors)`` returns the tensors to load into ``model`` (and
    into every copy of it that the backend makes later): the whole state dict, with the
    adapted entries new and the others the model's own tensors. The first call sets the
    model up (unmerged: LoRA layers injected in place; merged: base weights copied)."""

    def __init__(self, mode: str) -> None:
        if mode not in LORA_MODES:
            raise ValueError(f"unknown lora_mode {mode!r}; choose one of {LORA_MODES}")
        self.mode = mode
        self.spec: AdapterSpec | None = None
        self._base: dict[str, torch.Tensor] = {}  # merged: W0 of the adapted layers

    @torch.no_grad()
    def state_dict_for(
        self, model: torch.nn.Module, spec: AdapterSpec, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        if self.spec is None:
            self._set_up(model, spec, tensors)
        elif spec != self.spec:
            raise ValueError(
                f"a pushed adapter is {spec}, but this generator applies {self.spec}; one "
                "run pushes one adapter layout (base, rank, alpha, targets)"
            )
        own = {k: v.detach() for k, v in model.state_dict().items()}
        if self.mode == "merged":
            return {**own, **merged_state_dict(self._base, tensors, spec.scaling)}
        new = {}
        for key, t in tensors.items():
            module, ab = adapter_key_parts(key)
            new[f"{module}.lora_{ab}.default.weight"] = t
        unknown = sorted(set(new) - set(own))
        if unknown:
            raise ValueError(f"pushed adapter tensors {unknown[:3]} are not in the model")
        return {**own, **new}

    def _set_up(self, model, spec: AdapterSpec, tensors: dict[str, torch.Tensor]) -> None:
        check_targets(model, spec.target_modules, "the pushed adapter")
        modules = sorted(_pairs(tensors))
        if self.mode == "merged":
            own = model.state_dict()
            self._base = {f"{m}.weight": own[f"{m}.weight"].detach().clone() for m in modules}
        else:
            peft = import_peft()
            config = _peft_config(spec.target_modules, spec.rank, spec.alpha, 0.0, spec.base_model)
            peft.inject_adapter_in_model(config, model)
            model.requires_grad_(False)
        self.spec = spec


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a saved PEFT adapter directory (has ``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | os.PathLike) -> str:
    """The base model an adapter directory names (``base_model_name_or_path``)."""
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def load_base_model(path: str, dtype: Any, device: str, attn_implementation: str):
    """``forge.models.load_model``, also for an adapter directory: its base (itself perhaps
    an adapter directory, recursively) with the adapter merged in: a plain model."""
    from forge.models import load_model, local_source

    source = local_source(path)
    if not is_adapter_dir(source):
        return load_model(source, dtype, device, attn_implementation)
    peft = import_peft()
    base = load_base_model(adapter_base(source), dtype, device, attn_implementation)
    model = peft.PeftModel.from_pretrained(base, source).merge_and_unload()
    return model.eval()


def tokenizer_source(path: str) -> str:
    """Where the tokenizer of a model or adapter directory is: the directory itself, or for
    an adapter saved without one, its base's (recursively)."""
    from forge.models import local_source

    source = local_source(path)
    if is_adapter_dir(source) and not (Path(source) / "tokenizer_config.json").is_file():
        return tokenizer_source(adapter_base(source))
    return source
