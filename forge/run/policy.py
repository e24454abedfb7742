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
    temperature: float = 1.0

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
    out = dict(data)
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


def resolve_lora(trainer: Any, generator: Any, reference: Any) -> None:
    """A LoRA policy (``trainer.lora``): generators must apply pushed adapters (hf backend),
    and the reference's ``mode: auto`` becomes ``adapter_disabled`` (the trainer's own model
    with the adapter off; no reference service) or, without LoRA, ``separate``. Sets
    ``trainer.lora.disabled_reference`` accordingly; ``ValueError`` for what cannot work."""
    lora = trainer.lora
    if reference is not None and reference.mode == "auto":
        reference.mode = "separate" if lora is None else "adapter_disabled"
    if lora is None:
        if reference is not None and reference.mode == "adapter_disabled":
            raise ValueError(
                "reference.mode=adapter_disabled needs trainer.lora (the reference is the "
                "trainer's model with its adapter disabled); add trainer.lora or set "
                "reference.mode: separate"
            )
        return
    if generator.backend != "hf":
        raise ValueError(
            f"trainer.lora pushes LoRA adapters, which generator.backend {generator.backend!r} "
            "cannot apply yet (vLLM's enable_lora path is not implemented); use "
            "generator.backend: hf, or remove trainer.lora"
        )
    if reference is not None and reference.update.type != "none":
        raise ValueError(
            f"reference.update.type={reference.update.type!r} moves the reference towards "
            "pushed versions, which with trainer.lora are adapters the reference cannot apply "
            "yet; use reference.update.type: none (the base model) or full fine-tuning"
        )
    lora.disabled_reference = reference is not None and reference.mode == "adapter_disabled"
    if not lora.disabled_reference:
        return
    if reference.model != trainer.model:
        raise ValueError(
            f"reference.model={reference.model!r} is not the policy's base model "
            f"{trainer.model!r}, so it cannot be the trainer's model with the adapter "
            "disabled; set reference.mode: separate to run it as its own service"
        )


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
