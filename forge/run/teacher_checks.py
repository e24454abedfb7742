"""An RL run's ``teacher:`` section (on-policy distillation), checked when the config loads.

``check_teacher(cfg)`` refuses, before anything is spawned, what distillation cannot do in
this run: a teacher whose tokenizer differs from the student's (``check_tokenizers``: the
teacher scores the student's token ids, so every id must mean the same text), a privileged
prompt that reads a field the data's items lack (``check_prompt_fields``), and settings
whose advantages cannot take a per-token term; for GKD (``signal: gkd``) a ``top_k`` over
the vocabulary and a trainer backend it cannot run on; with several teachers, each of them,
and the routing field ``key`` must be in the data's items. ``teacher_reference(cfg, t)`` is
the ``ReferenceConfig`` a ``Teacher`` service loads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from forge.plugins import Spec
from forge.rollout.distiller import GROUP_FIELDS, privileged_prompt, template_fields
from forge.training.trainer_config import ReferenceConfig

__all__ = ["check_prompt_fields", "check_teacher", "check_tokenizers", "teacher_reference"]

SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def check_tokenizers(student: str, teacher: str) -> None:
    """``ValueError`` unless the two models' tokenizers have the same vocabulary (token ->
    id) and the same special ids; cross-tokenizer distillation is not supported."""
    from forge.models import load_tokenizer
    from forge.training.lora import tokenizer_source

    s_tok = load_tokenizer(tokenizer_source(student))
    t_tok = load_tokenizer(tokenizer_source(teacher))
    s_vocab, t_vocab = s_tok.get_vocab(), t_tok.get_vocab()
    where = f"teacher.model={teacher!r} and the student (policy.model={student!r})"
    fix = (
        "the teacher scores the student's token ids, so both must tokenize alike: use a "
        "teacher of the student's tokenizer family (cross-tokenizer distillation is not "
        "supported)"
    )
    if s_vocab != t_vocab:
        differ = sorted(
            {k for k in s_vocab.keys() ^ t_vocab.keys()}
            | {k for k in s_vocab.keys() & t_vocab.keys() if s_vocab[k] != t_vocab[k]}
        )
        example = ", ".join(
            f"{k!r}: {s_vocab.get(k, 'absent')} vs {t_vocab.get(k, 'absent')}" for k in differ[:3]
        )
        raise ValueError(
            f"{where} have different tokenizers: vocabularies of {len(s_vocab)} and "
            f"{len(t_vocab)} tokens, {len(differ)} tokens differ (student vs teacher id: "
            f"{example}); {fix}"
        )
    special = {n: (getattr(s_tok, n), getattr(t_tok, n)) for n in SPECIAL_IDS}
    special["all_special_ids"] = (sorted(s_tok.all_special_ids), sorted(t_tok.all_special_ids))
    wrong = [f"{n} {s} vs {t}" for n, (s, t) in special.items() if s != t]
    if wrong:
        raise ValueError(
            f"{where} share a vocabulary but not their special tokens (student vs teacher: "
            f"{'; '.join(wrong)}); {fix}"
        )


def _sample_item(data: Spec) -> dict:
    from forge.slots import DATA_SOURCE

    return DATA_SOURCE.resolve(data, key="data")().sample()


def check_prompt_fields(template: str, data: Spec, rewarded: bool, group_size: int) -> None:
    """``ValueError`` naming a field the privileged-prompt ``template`` reads that a data item
    (one sampled from a fresh copy of the data source) lacks, or ``{best_response}`` where
    there is no reward to pick it by."""
    fields = template_fields(template)
    if "best_response" in fields and (not rewarded or group_size < 2):
        raise ValueError(
            "teacher.prompt reads {best_response}, the group's highest-reward completion, which "
            f"needs rewards and group_size >= 2 (rewards: {'yes' if rewarded else 'none'}, "
            f"group_size {group_size}); add a reward or use the data's fields"
        )
    if not [f for f in fields if f not in GROUP_FIELDS]:
        return
    item = _sample_item(data)
    for name in fields:
        if name not in item and name not in GROUP_FIELDS:
            raise ValueError(
                f"teacher.prompt reads the field {{{name}}}, which the data's items lack (a "
                f"sampled item has {sorted(item)}; a group adds {list(GROUP_FIELDS)}); name "
                "one of those fields"
            )
    try:
        privileged_prompt(template, item, "")
    except (KeyError, IndexError, AttributeError, TypeError) as e:
        raise ValueError(f"teacher.prompt cannot be filled from a data item: {e!r}") from None


def check_teacher(cfg: Any) -> None:
    """The run-level checks of ``cfg.teacher`` (an ``RLConfig``'s; see the module). Resolves
    a GGUF file or shipped name in ``teacher.model`` to its converted directory."""
    from forge.models.gguf import resolve_model
    from forge.rollout.scoring import per_episode
    from forge.training.phases import resolve_phases

    t = cfg.teacher
    if t is None:
        return
    if cfg.env is not None or not per_episode(cfg.rollout.credit):
        raise ValueError(
            "teacher: distilling multi-turn episodes (env, rollout.credit) is not supported "
            "yet; remove the teacher section or the environment"
        )
    if cfg.critic is not None:
        raise ValueError(
            "teacher and critic: the critic's GAE gives the per-token advantages that the "
            "distillation term would be added to, which is not supported; remove one of them"
        )
    losses = [("trainer.loss", cfg.trainer.loss)]
    for phase in resolve_phases(cfg.phases, cfg.trainer.loss):
        losses.append((f"phases[{phase.index}].loss", phase.loss))
    for key, loss in losses:
        if loss.type == "gspo":
            raise ValueError(
                f"{key}.type=gspo takes one advantage per sequence, but the teacher gives one "
                "per token; use grpo (the clipped ratio against the generator's logprobs), "
                "ppo or reinforce"
            )
    rewarded = bool(cfg.rewards) or cfg.reward_model is not None
    if not rewarded and cfg.rollout.overlong_buffer:
        raise ValueError(
            "rollout.overlong_buffer shapes a reward, and pure distillation (a teacher, no "
            "rewards) has none; remove it or add a reward"
        )
    e = cfg.eval
    if not rewarded and e.reward is None and (e.at_start or e.at_end or e.every):
        raise ValueError(
            "pure distillation (a teacher, no rewards): held-out evaluation needs a reward to "
            "score answers; set eval.reward, or eval.at_start: false, eval.at_end: false"
        )
    if t.key is not None:
        item = _sample_item(cfg.data)
        if t.key not in item:
            raise ValueError(
                f"teacher.key={t.key!r} picks each episode's teacher by that data field, which "
                f"the data's items lack (a sampled item has {sorted(item)}); name one of them"
            )
    for name, one in t.teachers().items():
        where = f"teacher.models.{name}" if name else "teacher"
        if one.update.type != "none":
            _check_moving(cfg)
        if not one.self_distill:
            one.model = resolve_model(one.model)
            _check_model_exists(one.model, where)
            if cfg.policy.model != "from-run":  # a pipeline stage's policy is known only later
                check_tokenizers(cfg.policy.model, one.model)
        if one.prompt is not None:
            check_prompt_fields(one.prompt, cfg.data, rewarded, cfg.rollout.group_size)
        if one.signal == "gkd":
            _check_gkd(cfg, one, where)


def _check_model_exists(model: str, where: str) -> None:
    """``ValueError`` (a config error) for a teacher given as a local path (not a hub id) that does not
    exist on the controller's host, whose files the teacher's hosts would be sent."""
    from pathlib import Path

    from forge.models.loading import _looks_like_path, check_architecture

    if _looks_like_path(model) and not Path(model).expanduser().exists():
        raise ValueError(
            f"{where}.model={model!r}: no model directory there. A run's final policy is "
            "<run dir>/rl/model (or <run dir>/model for a one-stage run); train the teacher "
            "first or name an existing directory, GGUF file or shipped model"
        )
    check_architecture(model)


def _check_gkd(cfg: Any, t: Any, where: str) -> None:
    """GKD's loss term runs in the HF trainer, over at most the teacher's vocabulary."""
    from forge.models import load_tokenizer
    from forge.training.lora import tokenizer_source

    if cfg.trainer.backend != "hf":
        raise ValueError(
            f"{where}.signal: gkd adds a loss term that the {cfg.trainer.backend!r} trainer "
            "backend does not compute; use trainer.backend: hf or teacher.signal: reverse_kl"
        )
    model = cfg.policy.model if t.self_distill else t.model
    if model == "from-run":
        return
    vocab = len(load_tokenizer(tokenizer_source(model)))
    if t.top_k > vocab:
        raise ValueError(
            f"{where}.top_k={t.top_k} exceeds the teacher's vocabulary of {vocab} tokens; "
            f"set {where}.top_k to at most {vocab}"
        )


def _check_moving(cfg: Any) -> None:
    """A teacher that follows the student's pushes pulls them as a moving reference does."""
    t, w = cfg.teacher, cfg.trainer.weights
    what = f"teacher.update.type={t.update.type!r} pulls the student's pushed versions"
    if w.type == "broadcast":
        raise ValueError(
            f"{what}, but weights type broadcast sends them to the generators only; use "
            "weights type shm, or teacher.update.type: none"
        )
    if cfg.trainer.lora is not None:
        raise ValueError(
            f"{what}, which with trainer.lora are adapters the teacher cannot apply; use "
            "teacher.update.type: none or full fine-tuning"
        )
    if w.dtype and t.dtype != w.dtype:
        raise ValueError(
            f"{what}, rounded to trainer.weights.dtype={w.dtype!r}, but teacher.dtype="
            f"{t.dtype!r} would compute with the rounded values; set teacher.dtype: {w.dtype}"
        )


def teacher_reference(cfg: Any, t: Any = None) -> ReferenceConfig | None:
    """The ``ReferenceConfig`` the ``Teacher`` service of ``t`` (default: the run's one
    teacher) loads for ``cfg`` (an ``RLConfig``): the teacher's model (``policy``: the
    policy's), dtype, device and update rule, at the policy's temperature; ``None`` without a
    teacher."""
    if t is None:
        t = cfg.teacher
        if t is None:
            return None
        if t.models:
            raise ValueError(
                f"several teachers ({sorted(t.models)}): ask for one teacher's reference, "
                "teacher_reference(cfg, cfg.teacher.models[name])"
            )
    model = cfg.policy.model if t.self_distill else t.model
    return ReferenceConfig(
        model=model,
        mode="separate",
        dtype=t.dtype or "float32",  # ``auto``: decided by the teacher's own process
        device=t.device,
        attn_implementation=t.attn_implementation,
        temperature=cfg.policy.temperature,
        micro_batch_size=t.micro_batch_size,
        update=dataclasses.replace(t.update),
        weights=dataclasses.replace(cfg.trainer.weights),
    )
