"""Rules that move the reference policy towards the trained policy as training goes.

A frozen reference anchors the policy to where it started; on long runs that anchor can hold
the policy back (the KL term keeps growing). Two common remedies, chosen by
``ReferenceUpdateConfig.type``:

* ``ema``: after policy version ``v`` (when ``v % every == 0``) the reference becomes
  ``decay * ref + (1 - decay) * policy``, an exponential moving average of the policy
  versions it has seen (TR-DPO's "soft update").
* ``reset``: every ``every`` versions the reference is set to the policy (TR-DPO's "hard
  update"; ``every=1`` makes the KL term a trust region around the last version).
* ``none`` (default): the reference never moves.

The rule is a pure function of the version number (``should_update``), so a resumed run
updates at the same versions as an uninterrupted one. The tensors are HF-named state dicts,
exactly what the trainer pushes (``forge.weights``), so the functions here run on real tensors
in tests without any process::

    rule = ReferenceUpdateConfig(type="ema", decay=0.99)
    changed = apply_update_(rule, ref_model.state_dict(), pulled_policy_sd, version=7)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "REFERENCE_UPDATES",
    "ReferenceUpdateConfig",
    "apply_update_",
    "copy_update_",
    "ema_update_",
    "should_update",
]

REFERENCE_UPDATES = ("none", "ema", "reset")


@dataclass
class ReferenceUpdateConfig:
    """How the reference follows the policy (see the module docstring)."""

    type: str = "none"
    """``none`` (frozen), ``ema`` or ``reset``, or an import string ``pkg.module:fn`` of a rule
    ``fn(ref_sd, policy_sd, version) -> bool`` (``forge.slots.REFERENCE_UPDATE``)."""
    decay: float = 0.99
    """EMA weight of the old reference, ``ref <- decay * ref + (1 - decay) * policy``, in
    ``[0, 1)`` (0 copies the policy)."""
    every: int = 1
    """Apply the rule at policy versions that are multiples of ``every`` (``reset``: the
    reference is set to the policy every ``every`` versions)."""

    def __post_init__(self) -> None:
        if self.type not in REFERENCE_UPDATES:
            if ":" not in self.type:
                raise ValueError(
                    f"ReferenceUpdateConfig.type: unknown reference update type {self.type!r}; "
                    f"choose one of {REFERENCE_UPDATES} or an import string 'pkg.module:fn' "
                    "of a rule fn(ref_sd, policy_sd, version) -> bool"
                )
            from forge.slots import REFERENCE_UPDATE

            REFERENCE_UPDATE.validate(self.type, key="ReferenceUpdateConfig.type")
        if isinstance(self.decay, bool) or not 0.0 <= self.decay < 1.0:
            raise ValueError(
                f"ReferenceUpdateConfig.decay must be in [0, 1) (the EMA weight of the old "
                f"reference; 0.99 is typical), got {self.decay!r}"
            )
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise ValueError(
                f"ReferenceUpdateConfig.every must be an int >= 1 (apply the rule every k policy "
                f"versions), got {self.every!r}"
            )


def should_update(rule: ReferenceUpdateConfig, version: int) -> bool:
    """Whether policy ``version`` changes the reference: never for ``none`` or version 0 (the
    initial weights), else when ``version`` is a multiple of ``rule.every``."""
    return rule.type != "none" and version > 0 and version % rule.every == 0


def _check_names(ref_sd: dict[str, torch.Tensor], policy_sd: dict[str, torch.Tensor]) -> None:
    missing = sorted(set(ref_sd) - set(policy_sd))
    unexpected = sorted(set(policy_sd) - set(ref_sd))
    if missing or unexpected:
        raise ValueError(
            "the policy's weights do not match the reference's parameter names: missing from "
            f"the policy {missing[:5]} ({len(missing)} in all), unexpected in the policy "
            f"{unexpected[:5]} ({len(unexpected)} in all); the reference must load the same "
            "model architecture as the trainer (ReferenceConfig.model)"
        )
    for name, ref in ref_sd.items():
        if ref.shape != policy_sd[name].shape:
            raise ValueError(
                f"parameter {name!r} is {list(policy_sd[name].shape)} in the policy but "
                f"{list(ref.shape)} in the reference; they must be the same model"
            )


def _distinct(ref_sd: dict[str, torch.Tensor]) -> list[str]:
    """Names of ``ref_sd`` minus later aliases of the same storage (tied embeddings list
    ``lm_head.weight`` and ``model.embed_tokens.weight``, one tensor): an in-place update
    must touch each tensor once, or an EMA would be applied twice to it."""
    seen: set[tuple] = set()
    names = []
    for name, t in ref_sd.items():
        key = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if t.numel() and key in seen:
            continue
        seen.add(key)
        names.append(name)
    return names


@torch.no_grad()
def ema_update_(
    ref_sd: dict[str, torch.Tensor], policy_sd: dict[str, torch.Tensor], decay: float
) -> None:
    """In place: ``ref <- decay * ref + (1 - decay) * policy`` for every tensor of ``ref_sd``.

    The blend is computed in float32 whatever the dtypes (a bf16 reference and an fp32 or bf16
    policy alike), then rounded once to the reference's dtype. Rounding happens every update,
    so with bf16 (8 mantissa bits) and ``decay`` close to 1 a small step
    ``(1 - decay) * (policy - ref)`` below half a bf16 ulp of ``ref`` is lost: keep the
    reference in float32 when it must track a slowly moving policy. Non-floating tensors
    (integer buffers) are copied. The policy may live on another device (it is moved).
    Raises ``ValueError`` naming the missing / unexpected names or a shape mismatch.
    """
    _check_names(ref_sd, policy_sd)
    for name in _distinct(ref_sd):
        ref, policy = ref_sd[name], policy_sd[name]
        if not ref.is_floating_point():
            ref.copy_(policy)
            continue
        blend = ref.float().mul_(decay).add_(policy.to(ref.device, torch.float32), alpha=1 - decay)
        ref.copy_(blend)


@torch.no_grad()
def copy_update_(ref_sd: dict[str, torch.Tensor], policy_sd: dict[str, torch.Tensor]) -> None:
    """In place: ``ref <- policy`` (cast to the reference's dtype and device). Same checks as
    :func:`ema_update_`."""
    _check_names(ref_sd, policy_sd)
    for name in _distinct(ref_sd):
        ref_sd[name].copy_(policy_sd[name])


def apply_update_(
    rule: ReferenceUpdateConfig,
    ref_sd: dict[str, torch.Tensor],
    policy_sd: dict[str, torch.Tensor],
    version: int,
) -> bool:
    """Apply ``rule`` for policy ``version`` to ``ref_sd`` in place; returns whether the
    weights changed (``False`` for ``none`` and for versions the rule skips)."""
    if not should_update(rule, version):
        return False
    if rule.type == "ema":
        ema_update_(ref_sd, policy_sd, rule.decay)
    elif rule.type == "reset":
        copy_update_(ref_sd, policy_sd)
    else:  # a user rule: it edits ref_sd in place and says whether it changed anything
        from forge.slots import REFERENCE_UPDATE

        _check_names(ref_sd, policy_sd)
        with torch.no_grad():
            return bool(REFERENCE_UPDATE.resolve(rule.type)(ref_sd, policy_sd, version))
    return True
