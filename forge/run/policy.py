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

__all__ = ["PolicyConfig", "check_policy", "policy_defaults", "retarget"]

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
