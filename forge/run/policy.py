"""The policy's facts, stated once: its model and its sampling temperature.

A run's config names them in one ``policy:`` section; they flow to every role that computes
with the policy (the generator samples from it, the trainer and a reference model compute
its logprobs, evaluation samples from it) when the config loads::

    policy: {model: Qwen/Qwen3-1.7B, temperature: 1.0}
    generator: {max_batch_size: 64}        # model: the policy's
    trainer: {loss: {type: grpo}}          # model and temperature: the policy's

A role may still name a model of its own where it differs on purpose (a reference or value
model from another checkpoint): it says so by setting ``model``. The generator and the
trainer are the policy, so a ``model`` of theirs that differs from ``policy.model`` is an
error, and so is a logprob ``temperature`` (trainer, reference) that differs from the
sampling temperature: every policy ratio would be skewed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["PolicyConfig", "check_policy", "policy_defaults", "resolve_lora", "retarget"]

SAME_MODEL = ("generator", "trainer")  # these are the policy: same model, no exceptions
OWN_MODEL_ALLOWED = ("reference", "critic")  # may name another model on purpose
SAME_TEMPERATURE = ("trainer", "reference")  # logprobs of logits / T, as sampled


@dataclass
class PolicyConfig:
    """The policy: ``model`` (an HF model directory or hub id) and the ``temperature`` it
    samples at in rollouts (logprobs are computed at the same temperature)."""

    model: str
    """An HF model directory, a hub id, a GGUF file or a shipped model's name
    (``forge.models.gguf``); ``from-run`` in a pipeline stage: the previous stage's result."""
    temperature: float = 1.0
    """The sampling temperature of rollouts; logprobs are computed at the same one."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"policy.model must be a model directory or hub id, got {self.model!r}"
            )
        if self.temperature < 0:
            raise ValueError(f"policy.temperature must be >= 0, got {self.temperature}")


def policy_defaults(data: dict[str, Any], roles: tuple[str, ...]) -> dict[str, Any]:
    """A run section's plain data with the policy's facts filled into its ``roles`` (the
    role sections its schema has, of ``generator``, ``trainer``, ``reference``, ``critic``):
    each gets ``model`` and, where it computes logprobs, ``temperature`` unless it states
    them itself; a generator or trainer section left out is made. Conflicts are left for
    ``check_policy``, which names them."""
    policy = data.get("policy")
    if not isinstance(policy, dict) or "model" not in policy:
        return data
    model, temperature = policy["model"], policy.get("temperature", 1.0)
    if isinstance(model, str):  # a GGUF file or shipped model: its converted directory
        from forge.models.gguf import resolve_model
        from forge.models.loading import check_architecture, check_tokenizer

        model = resolve_model(model)
        check_architecture(model)
        check_tokenizer(model)
    out = {**data, "policy": {**policy, "model": model}}
    for role in roles:
        section = out.get(role)
        if role in SAME_MODEL and section is None:
            section = {}
        if isinstance(section, dict):
            section = {"model": model, **section}
            if role in SAME_TEMPERATURE:
                section = {"temperature": temperature, **section}
            out[role] = section
    return out


def check_policy(policy: PolicyConfig, **roles: Any) -> None:
    """Raise ``ValueError`` where a role contradicts the policy (see the module)."""
    for name in SAME_MODEL:
        role = roles.get(name)
        if role is not None and role.model != policy.model:
            raise ValueError(
                f"{name}.model={role.model!r} but policy.model={policy.model!r}: the {name} is "
                f"the policy, so it must use the policy's model; remove {name}.model (it "
                "follows policy.model)"
            )
    for name in SAME_TEMPERATURE:
        role = roles.get(name)
        if role is not None and role.temperature != policy.temperature:
            raise ValueError(
                f"{name}.temperature={role.temperature} but policy.temperature="
                f"{policy.temperature}: logprobs at another temperature than the samples' "
                f"skew every policy ratio; remove {name}.temperature (it follows "
                "policy.temperature)"
            )


def resolve_lora(trainer: Any, generator: Any, reference: Any) -> tuple[Any, Any, Any]:
    """``(trainer, generator, reference)`` resolved for a LoRA policy (``trainer.lora``):
    generators must apply pushed adapters (the vllm backend gets its LoRA engine settings
    from ``enable_vllm_lora``), and the reference's ``mode: auto`` becomes
    ``adapter_disabled`` (the trainer's own model with the adapter off; no reference
    service) or, without LoRA, ``separate``; ``trainer.lora.disabled_reference`` follows.

    The configs given are left as they are: a resolved one is a new object
    (``dataclasses.replace``), so checking a config never changes one a caller holds.
    ``ValueError`` for what cannot work."""
    lora = trainer.lora
    if reference is not None and reference.mode == "auto":
        mode = "separate" if lora is None else "adapter_disabled"
        reference = dataclasses.replace(reference, mode=mode)
    if lora is None:
        if reference is not None and reference.mode == "adapter_disabled":
            raise ValueError(
                "reference.mode=adapter_disabled needs trainer.lora (the reference is the "
                "trainer's model with its adapter disabled); add trainer.lora or set "
                "reference.mode: separate"
            )
        return trainer, generator, reference
    if generator.backend == "vllm":
        generator = enable_vllm_lora(generator, lora)
    if reference is not None and reference.update.type != "none":
        raise ValueError(
            f"reference.update.type={reference.update.type!r} moves the reference towards "
            "pushed versions, which with trainer.lora are adapters the reference cannot apply "
            "yet; use reference.update.type: none (the base model) or full fine-tuning"
        )
    disabled = reference is not None and reference.mode == "adapter_disabled"
    if reference is not None and disabled and reference.model != trainer.model:
        raise ValueError(
            f"reference.model={reference.model!r} is not the policy's base model "
            f"{trainer.model!r}, so it cannot be the trainer's model with the adapter "
            "disabled; set reference.mode: separate to run it as its own service"
        )
    if lora.disabled_reference != disabled:
        lora = dataclasses.replace(lora, disabled_reference=disabled)
        trainer = dataclasses.replace(trainer, lora=lora)
    return trainer, generator, reference


# The ranks vLLM's LoRA engine accepts as max_lora_rank (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def enable_vllm_lora(generator: Any, lora: Any) -> Any:
    """A vllm generator config with its engine set up for the trainer's LoRA pushes:
    ``enable_lora``, the smallest ``max_lora_rank`` vLLM accepts that holds ``lora.rank``,
    and ``max_loras: 2`` (a new version loads next to the one running requests still use).
    The user's own ``engine_kwargs`` win; ones that cannot serve the adapters are a
    ``ValueError``. Returns a new config (the one given is left as it is)."""
    bad = [t for t in lora.target_modules if t not in VLLM_LORA_TARGETS]
    if bad:
        raise ValueError(
            f"trainer.lora.target_modules {bad} cannot be served by generator.backend vllm "
            f"(Forge's vLLM path adapts {list(VLLM_LORA_TARGETS)}; the tied lm_head / "
            "embeddings are not); remove them or use generator.backend: hf"
        )
    rank = next((r for r in VLLM_LORA_RANKS if r >= lora.rank), None)
    if rank is None:
        raise ValueError(f"trainer.lora.rank={lora.rank} is above vLLM's largest LoRA rank 512")
    kw = generator.engine_kwargs
    if kw.get("enable_lora", True) is not True:
        raise ValueError(
            "generator.engine_kwargs.enable_lora is false, but trainer.lora pushes adapters "
            "the vllm generator must load; remove enable_lora (Forge sets it)"
        )
    if kw.get("max_lora_rank", rank) < lora.rank:
        raise ValueError(
            f"generator.engine_kwargs.max_lora_rank={kw['max_lora_rank']} is below "
            f"trainer.lora.rank={lora.rank}; remove it (Forge sets {rank})"
        )
    kwargs = {"enable_lora": True, "max_lora_rank": rank, "max_loras": 2, **kw}
    return dataclasses.replace(generator, engine_kwargs=kwargs)


def retarget(cfg: Any, model: str) -> None:
    """Point a run config's policy at ``model`` (e.g. the result of an SFT stage): the
    policy and every role that used the policy's model follow; roles that named a model of
    their own keep it."""
    old = cfg.policy.model
    for name in (*SAME_MODEL, *OWN_MODEL_ALLOWED):
        role = getattr(cfg, name, None)
        if role is not None and role.model == old:
            role.model = model
    cfg.policy.model = model
