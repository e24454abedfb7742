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

With ``signal: gkd`` the teacher also returns its ``top_k`` likeliest tokens per position;
they become the episode's ``teacher_topk`` (with the teacher's ``beta`` and ``coef``), the
targets of the trainer's GKD loss term (``forge.losses.gkd``), and no distillation advantage
is added. Every episode keeps the teacher's logprobs of its tokens (``teacher_logprobs``, for
the episode log).

Several teachers (``teacher.models``, keyed by the value of the data field ``teacher.key``):
each is its own service (``forge.run.teachers.spawn_teachers``), and a group goes to the teacher named by its
item's value (``TeacherConfig.route``).

Metrics (means over the step): ``rollout/teacher_kl`` (each episode's token mean of
``log p_student - log p_teacher``), ``rollout/teacher_entropy`` (each episode's token mean of
the teacher's entropy) and ``rollout/distill_share`` (each group's ``sum |d| / (sum |reward
advantage| + sum |d|)``; reverse-KL teachers only: GKD's term is a loss, not an advantage);
with several teachers also ``rollout/teacher_kl/<name>`` and ``rollout/teacher_entropy/<name>``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from forge.losses.distill import distill_advantages, distill_share, reverse_kl
from forge.observability.names import M
from forge.training.reference_update import ReferenceUpdateConfig
from forge.types import Episode, TeacherScore, TeacherTopK

if TYPE_CHECKING:
    from forge.actors.teacher import Teacher

__all__ = [
    "GROUP_FIELDS",
    "POLICY",
    "Distiller",
    "TeacherConfig",
    "Teachers",
    "add_distillation",
    "privileged_prompt",
    "template_fields",
]

POLICY = "policy"  # teacher.model: the student's own starting weights
GROUP_FIELDS = ("best_response",)  # template fields a group provides, besides the item's
SIGNALS = ("reverse_kl", "gkd")
GKD_BETA = 0.5  # TRL's GKDConfig default
# Fields that hold several teachers; with them, the other fields are set per teacher.
SET_FIELDS = ("key", "models", "default")


@dataclass
class TeacherConfig:
    """On-policy distillation: a frozen teacher scores the student's sampled tokens, and the
    per-token reverse KL ``log p_student - log p_teacher`` (stop-gradient) becomes a per-token
    advantage (``forge.losses.distill``; docs/distillation.md). The teacher runs as a
    service of ``replicas.teacher`` replicas and computes at the policy's temperature; its
    tokenizer must equal the student's (checked at load). ``signal: gkd`` trains on a loss
    against the teacher's top-k instead (TRL's GKD). Several teachers: ``key`` and
    ``models``, each entry a ``TeacherConfig`` of its own."""

    model: str = ""
    """HF model directory, hub id, GGUF file or shipped model name; ``policy``: the student's
    own starting weights (self-distillation, usually with a privileged ``prompt``). Required
    unless ``models`` is given."""
    signal: Literal["reverse_kl", "gkd"] = "reverse_kl"
    """``reverse_kl``: the per-token advantage ``-coef * (log p_student - log p_teacher)``;
    ``gkd``: a loss term ``coef * generalized_jsd`` over the teacher's ``top_k`` tokens
    (``beta``), added to the trainer's loss (``forge.losses.gkd``)."""
    coef: float = 1.0
    """The distillation term's weight: of the advantage (``reverse_kl``, tinker-cookbook's
    ``kl_penalty_coef``) or of the GKD loss term (``gkd``)."""
    discount: float = 0.0
    """``reverse_kl``: each token's advantage also sums later tokens' ``-coef * KL``,
    discounted by this per token (tinker-cookbook's ``kl_discount_factor``; 0: each token
    alone, 1: the whole rest of the response)."""
    top_k: int | None = None
    """``gkd`` (required there): how many of the teacher's likeliest tokens per position the
    loss compares over (both distributions coarsened to those ids and the rest)."""
    beta: float | None = None
    """``gkd``: 0 forward KL(teacher || student), 1 reverse KL(student || teacher), between:
    the generalized JSD of TRL's GKD (``None``: 0.5)."""
    stop_at_logprob: float | None = None
    """Distil each response only up to the first sampled token to which the teacher gives a
    logprob below this, that token included (``None``: every token). Past a token the teacher
    would not have written, the student is somewhere the teacher would not be, and what the
    teacher says there (often: end now) is not worth learning: a teacher that knows only the
    answer, shown a wrong first digit, teaches the student to stop after one digit."""
    replicas: int | None = None
    """This teacher's service replicas (``None``: ``replicas.teacher``)."""
    key: str | None = None
    """Several teachers: the data field whose value picks an episode's teacher in
    ``models``."""
    models: dict[str, TeacherConfig] = field(default_factory=dict)
    """Several teachers, by the value of the data field ``key`` (each a teacher section of its
    own); the top-level fields other than ``key``, ``models``, ``default`` are then unset."""
    default: str | None = None
    """Several teachers: the teacher (a name in ``models``) of a value that names none
    (``None``: such a value is an error naming it)."""
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
        if self.models or self.key is not None or self.default is not None:
            self._check_set()
            return
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(
                f"teacher.model must be a model directory, hub id or 'policy', got {self.model!r}"
                " (or give several teachers: teacher.key and teacher.models)"
            )
        self._check_signal()
        if self.replicas is not None and self.replicas < 1:
            raise ValueError(f"teacher.replicas must be >= 1, got {self.replicas}")
        if not self.coef > 0:
            raise ValueError(f"teacher.coef must be > 0, got {self.coef}")
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"teacher.discount must be in [0, 1], got {self.discount}")
        if self.stop_at_logprob is not None and not self.stop_at_logprob < 0:
            raise ValueError(
                f"teacher.stop_at_logprob is a logprob and must be < 0 (e.g. -4.6, a 1% "
                f"token), got {self.stop_at_logprob}"
            )
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

    def _check_signal(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"teacher.signal must be one of {SIGNALS}, got {self.signal!r}")
        if self.signal == "reverse_kl":
            for name in ("top_k", "beta"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"teacher.{name} is a setting of teacher.signal: gkd, and this teacher's "
                        f"signal is reverse_kl; remove teacher.{name} or set teacher.signal: gkd"
                    )
            return
        if self.top_k is None or self.top_k < 1:
            raise ValueError(
                f"teacher.signal: gkd needs teacher.top_k >= 1 (how many of the teacher's "
                f"likeliest tokens the loss compares over), got {self.top_k}"
            )
        if self.beta is None:
            self.beta = GKD_BETA
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(
                f"teacher.beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {self.beta}"
            )
        if self.discount != 0.0:
            raise ValueError(
                f"teacher.discount={self.discount} sums later tokens' reverse-KL advantages, "
                "which teacher.signal: gkd does not use (its term is a loss per token); remove "
                "teacher.discount"
            )
        if self.update.type != "none":
            raise ValueError(
                "teacher.update with teacher.signal: gkd is not supported (a teacher following "
                "the student gives top-k targets of the student itself); set "
                "teacher.update.type: none"
            )

    def _check_set(self) -> None:
        """Several teachers: ``key`` and ``models`` given, every other field left unset."""
        if not self.models or not self.key:
            raise ValueError(
                "several teachers need both teacher.key (the data field that picks one) and "
                f"teacher.models (name -> teacher), got key={self.key!r} and "
                f"{len(self.models)} models"
            )
        for f in dataclasses.fields(self):
            if f.name in SET_FIELDS:
                continue
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
            if getattr(self, f.name) != default:
                raise ValueError(
                    f"teacher.{f.name} is set per teacher when teacher.models is given; move it "
                    f"under teacher.models.<name>.{f.name}"
                )
        for name, t in self.models.items():
            if not isinstance(t, TeacherConfig):
                raise TypeError(f"teacher.models.{name} must be a teacher section, got {t!r}")
            if t.models or t.key is not None or t.default is not None:
                raise ValueError(f"teacher.models.{name}: a teacher of a set cannot hold teachers")
            if t.update.type != "none":
                raise ValueError(
                    f"teacher.models.{name}.update: a teacher that follows the student is "
                    "supported with one teacher only; set its update.type: none"
                )
        if self.default is not None and self.default not in self.models:
            raise ValueError(
                f"teacher.default={self.default!r} is not one of teacher.models "
                f"{sorted(self.models)}"
            )

    @property
    def self_distill(self) -> bool:
        """The teacher is the student's own starting weights."""
        return self.model == POLICY

    def teachers(self) -> dict[str, TeacherConfig]:
        """Each teacher by name: ``models``, or ``{"": self}`` for one teacher."""
        return dict(self.models) if self.models else {"": self}

    def route(self, item: dict[str, Any]) -> str:
        """The name of the teacher for data item ``item`` (``""`` for one teacher);
        ``ValueError`` naming the value and the configured names when none is its teacher."""
        if not self.models:
            return ""
        if self.key not in item:
            raise ValueError(
                f"teacher.key={self.key!r}: a data item has no such field (it has "
                f"{sorted(item)}); name a field of the data's items"
            )
        value = item[self.key]
        if str(value) in self.models:
            return str(value)
        if self.default is not None:
            return self.default
        raise ValueError(
            f"teacher.key={self.key!r}: a data item's value {value!r} has no teacher in "
            f"teacher.models {sorted(self.models)} and teacher.default is unset; add a teacher "
            "for it or set teacher.default"
        )


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


def distilled_tokens(teacher_logprobs: list[float], stop_at_logprob: float | None) -> int:
    """How many leading tokens of a response are distilled: up to and including the first
    whose teacher logprob is below ``stop_at_logprob`` (all of them when ``None`` or none is)."""
    if stop_at_logprob is None:
        return len(teacher_logprobs)
    for i, q in enumerate(teacher_logprobs):
        if q < stop_at_logprob:
            return i + 1
    return len(teacher_logprobs)


def add_distillation(
    group: list[Episode],
    scores: list[TeacherScore],
    coef: float,
    discount: float,
    beta: float | None = None,
    stop_at_logprob: float | None = None,
) -> dict[str, list[float]]:
    """Set each episode's ``token_advantages`` to its reward advantage plus the distillation
    advantage against ``scores`` (one per episode); with ``beta`` (GKD) set its
    ``teacher_topk`` instead and leave its advantage alone. Only each response's first
    ``distilled_tokens(..., stop_at_logprob)`` tokens are distilled (past them: no distillation
    advantage, and top-k targets of ``-inf``, which the GKD loss counts as no term). Every
    episode keeps the teacher's logprobs (``teacher_logprobs``). Returns the group's metric
    values."""
    if len(scores) != len(group):
        raise ValueError(f"the teacher scored {len(scores)} responses of a group of {len(group)}")
    for e, score in zip(group, scores):
        e.teacher_logprobs = list(score.logprobs)
    kept = [distilled_tokens(s.logprobs, stop_at_logprob) for s in scores]
    mask_bt = _rows(group, [[1.0] * len(e.response_ids) for e in group])  # single-turn
    distil_bt = _rows(group, [[1.0] * n for n in kept])
    s_bt = _rows(group, [e.behavior_logprobs for e in group])
    q_bt = _rows(group, [s.logprobs for s in scores])
    tokens_b = mask_bt.sum(-1).clamp(min=1.0)
    kl_b = reverse_kl(s_bt, q_bt, mask_bt).sum(-1) / tokens_b
    ent_b = (_rows(group, [s.entropy for s in scores]) * mask_bt).sum(-1) / tokens_b
    metrics = {M.TEACHER_KL: kl_b.tolist(), M.TEACHER_ENTROPY: ent_b.tolist()}
    if stop_at_logprob is not None:
        metrics[M.DISTILLED_FRACTION] = (distil_bt.sum(-1) / tokens_b).tolist()
    if beta is not None:
        for e, score, n in zip(group, scores, kept):
            if score.topk_ids is None or score.topk_logprobs is None:
                raise ValueError("teacher.signal: gkd, but the teacher returned no top-k")
            lps = [
                list(x) if i < n else [-math.inf] * len(x)
                for i, x in enumerate(score.topk_logprobs)
            ]
            e.teacher_topk = TeacherTopK(score.topk_ids, lps, beta, coef)
        return metrics
    reward_bt = _rows(
        group,
        [e.token_advantages or [e.advantage] * len(e.response_ids) for e in group],
    )
    d_bt = distill_advantages(s_bt, q_bt, distil_bt, coef, discount)
    for b, e in enumerate(group):
        n = len(e.response_ids)
        e.token_advantages = (reward_bt[b, :n] + d_bt[b, :n]).tolist()
    metrics[M.DISTILL_SHARE] = [distill_share(reward_bt, d_bt, mask_bt)]
    return metrics


@dataclass
class Teachers:
    """The run's teacher services by name (``""``: the one teacher of a single section)."""

    services: dict[str, Teacher]

    @property
    def follower(self) -> Teacher | None:
        """The service that pulls the student's pushed versions (``teacher.update``; a frozen
        one ignores them): the one teacher's, or ``None`` with several (they cannot follow)."""
        return self.services.get("")


class Distiller:
    """The teacher's part of scoring a group (see the module): ``cfg`` a ``TeacherConfig``,
    ``teachers`` the ``Teachers`` (or, for one teacher, its ``Teacher`` service), ``log`` the
    run's ``MetricLog``."""

    def __init__(self, cfg: TeacherConfig, teachers, log) -> None:
        self.cfg, self.log = cfg, log
        self.services = teachers.services if isinstance(teachers, Teachers) else {"": teachers}

    async def __call__(
        self, group: list[Episode], item: dict, texts: list[str], rewards: list[float]
    ) -> None:
        name = self.cfg.route(item)
        t = self.cfg.teachers()[name]
        prompts = None
        if t.prompt is not None:
            best = texts[max(range(len(texts)), key=rewards.__getitem__)] if rewards else None
            prompts = [privileged_prompt(t.prompt, item, best)] * len(group)
        gkd = t.signal == "gkd"
        scores = await self.services[name].score.route(group, prompts, t.top_k or 0)
        metrics = add_distillation(
            group, scores, t.coef, t.discount, t.beta if gkd else None, t.stop_at_logprob
        )
        for key, values in metrics.items():
            self.log.add(key, values)
            if name and key != M.DISTILL_SHARE:
                self.log.add(f"{key}/{name}", values)
