"""On-policy distillation on the rollout side: a teacher scores each group, and its
per-token signal joins the group's advantages.

    distiller = Distiller(cfg.teacher, teacher_service, log)
    await distiller(group, item, texts, rewards)     # in GroupScorer.produce, once per group

For every episode of the group the teacher (``forge.actors.teacher``) returns its logprob of
each sampled token and its entropy there; the episode's ``token_advantages`` become its reward
advantage (``Episode.advantage``, 0 without rewards) plus the distillation advantage ``d_t``
of ``forge.losses.distill`` against the generator's logprobs (``behavior_logprobs``). The
trainer's loss (``grpo``: the clipped ratio against the generator's logprobs) then trains on
them like any per-token advantage.

A privileged prompt (``TeacherConfig.prompt``, self-distillation) is a ``str.format``
template over the data item's fields and ``best_response`` (the text of the group's
highest-reward completion): only the teacher reads it; the student's prompt is unchanged.

Metrics (means over the step): ``rollout/teacher_kl`` (each episode's token mean of
``log p_student - log p_teacher``), ``rollout/teacher_entropy`` (each episode's token mean of
the teacher's entropy) and ``rollout/distill_share`` (each group's ``sum |d| / (sum |reward
advantage| + sum |d|)``).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from forge.losses.distill import distill_advantages, distill_share, reverse_kl
from forge.observability.names import M
from forge.training.reference_update import ReferenceUpdateConfig
from forge.types import Episode, TeacherScore

__all__ = [
    "GROUP_FIELDS",
    "POLICY",
    "Distiller",
    "TeacherConfig",
    "add_distillation",
    "privileged_prompt",
    "template_fields",
]

POLICY = "policy"  # teacher.model: the student's own starting weights
GROUP_FIELDS = ("best_response",)  # template fields a group provides, besides the item's


@dataclass
class TeacherConfig:
    """On-policy distillation: a frozen teacher scores the student's sampled tokens, and the
    per-token reverse KL ``log p_student - log p_teacher`` (stop-gradient) becomes a per-token
    advantage (``forge.losses.distill``; docs/distillation.md). The teacher runs as a
    service of ``replicas.teacher`` replicas and computes at the policy's temperature; its
    tokenizer must equal the student's (checked at load)."""

    model: str
    """HF model directory, hub id, GGUF file or shipped model name; ``policy``: the student's
    own starting weights (self-distillation, usually with a privileged ``prompt``)."""
    coef: float = 1.0
    """The distillation advantage's weight (tinker-cookbook's ``kl_penalty_coef``)."""
    discount: float = 0.0
    """Each token's advantage also sums later tokens' ``-coef * KL``, discounted by this per
    token (tinker-cookbook's ``kl_discount_factor``; 0: each token alone, 1: the whole rest of
    the response)."""
    prompt: str | None = None
    """A privileged prompt only the teacher sees, a ``str.format`` template over the data
    item's fields (``{prompt}``: the student's prompt text, for chat prompts the last user
    message's content, which the result replaces; ``{target}``, ...) and ``{best_response}``
    (the group's highest-reward completion); ``None``: the student's prompt. Fields are
    checked against a data item at load."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """The teacher's weights' dtype (``auto``: bfloat16 where the device computes it
    natively, else float32)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """``auto``: ``cuda`` when a GPU is visible, else ``cpu``."""
    attn_implementation: str = "eager"
    """The transformers attention implementation."""
    micro_batch_size: int | None = None
    """Rows per teacher forward (``None``: a whole group at once)."""
    update: ReferenceUpdateConfig = field(default_factory=ReferenceUpdateConfig)
    """With ``model: policy``, how the teacher follows the student's pushed versions, as a
    moving reference does (default ``none``: the frozen starting weights; ``reset`` every 1:
    the student's current weights; ``ema``: an average of them)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"teacher.model must be a model directory, hub id or 'policy', got {self.model!r}"
            )
        if not self.coef > 0:
            raise ValueError(f"teacher.coef must be > 0, got {self.coef}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"teacher.discount must be in [0, 1], got {self.discount}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"teacher.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.prompt is not None:
            template_fields(self.prompt)  # a malformed template fails here
        if self.update.type != "none" and not self.self_distill:
            raise ValueError(
                f"teacher.update.type={self.update.type!r} moves the teacher to the student's "
                f"pushed weights, which only the student's own model can load; set "
                f"teacher.model: policy (self-distillation) or teacher.update.type: none"
            )

    @property
    def self_distill(self) -> bool:
        """The teacher is the student's own starting weights."""
        return self.model == POLICY


def template_fields(template: str) -> list[str]:
    """The field names a privileged-prompt template reads (``{target}``, ``{meta[k]}`` ->
    ``target``, ``meta``); ``ValueError`` for a malformed or positional one."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"teacher.prompt is not a valid template ({e}): {template!r}") from None
    names = []
    for _, name, _, _ in parsed:
        if name is None:
            continue
        base = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not base or base.isdigit():
            raise ValueError(
                f"teacher.prompt: a field must name a data field ({{prompt}}, {{target}}, ...), "
                f"got {{{name}}}"
            )
        names.append(base)
    return names


def privileged_prompt(template: str, item: dict[str, Any], best_response: str | None = None):
    """The teacher's prompt for ``item``: ``template`` filled with the item's fields and
    ``best_response``. A text prompt is replaced whole; for chat messages ``{prompt}`` is the
    last user message's content and the result replaces that message's content."""
    prompt = item["prompt"]
    values = {**item, "best_response": best_response}
    if isinstance(prompt, str):
        return template.format(**values)
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        users = [i for i, m in enumerate(prompt) if m.get("role") == "user"]
        if not users:
            raise ValueError("teacher.prompt: a chat prompt without a user message to rewrite")
        last = users[-1]
        values["prompt"] = prompt[last].get("content", "")
        out = [dict(m) for m in prompt]
        out[last]["content"] = template.format(**values)
        return out
    raise ValueError(
        f"teacher.prompt needs text or chat-message prompts, got {type(prompt).__name__} "
        "(token ids cannot be templated); remove teacher.prompt"
    )


def _rows(group: list[Episode], values: list[list[float]]) -> torch.Tensor:
    width = max(len(e.response_ids) for e in group)
    out_bt = torch.zeros(len(group), width)
    for b, v in enumerate(values):
        out_bt[b, : len(v)] = torch.tensor(v, dtype=torch.float32)
    return out_bt


def add_distillation(
    group: list[Episode], scores: list[TeacherScore], coef: float, discount: float
) -> dict[str, list[float]]:
    """Set each episode's ``token_advantages`` to its reward advantage plus the distillation
    advantage against ``scores`` (one per episode); returns the group's metric values."""
    if len(scores) != len(group):
        raise ValueError(f"the teacher scored {len(scores)} responses of a group of {len(group)}")
    mask_bt = _rows(group, [[1.0] * len(e.response_ids) for e in group])  # single-turn
    s_bt = _rows(group, [e.behavior_logprobs for e in group])
    q_bt = _rows(group, [s.logprobs for s in scores])
    reward_bt = _rows(
        group,
        [e.token_advantages or [e.advantage] * len(e.response_ids) for e in group],
    )
    d_bt = distill_advantages(s_bt, q_bt, mask_bt, coef, discount)
    for b, e in enumerate(group):
        n = len(e.response_ids)
        e.token_advantages = (reward_bt[b, :n] + d_bt[b, :n]).tolist()
    tokens_b = mask_bt.sum(-1).clamp(min=1.0)
    kl_b = reverse_kl(s_bt, q_bt, mask_bt).sum(-1) / tokens_b
    ent_b = (_rows(group, [s.entropy for s in scores]) * mask_bt).sum(-1) / tokens_b
    return {
        M.TEACHER_KL: kl_b.tolist(),
        M.TEACHER_ENTROPY: ent_b.tolist(),
        M.DISTILL_SHARE: [distill_share(reward_bt, d_bt, mask_bt)],
    }


class Distiller:
    """The teacher's part of scoring a group (see the module): ``cfg`` a ``TeacherConfig``,
    ``teacher`` the ``Teacher`` service, ``log`` the run's ``MetricLog``."""

    def __init__(self, cfg: TeacherConfig, teacher, log) -> None:
        self.cfg, self.teacher, self.log = cfg, teacher, log

    async def __call__(
        self, group: list[Episode], item: dict, texts: list[str], rewards: list[float]
    ) -> None:
        prompts = None
        if self.cfg.prompt is not None:
            best = texts[max(range(len(texts)), key=rewards.__getitem__)] if rewards else None
            prompts = [privileged_prompt(self.cfg.prompt, item, best)] * len(group)
        scores = await self.teacher.score.route(group, prompts)
        metrics = add_distillation(group, scores, self.cfg.coef, self.cfg.discount)
        for key, values in metrics.items():
            self.log.add(key, values)
