"""Turn a list of :class:`~forge.types.Episode` into one padded :class:`~forge.types.TrainBatch`.

Layout of row ``b`` (prompt length ``p``, response length ``r``, right padding to ``T``)::

    position      0 .. p-1        p .. p+r-1              p+r .. T-1
    input_ids     prompt ids      response ids            pad_id
    attention     1               1                       0
    response      0               1                       0
    logprobs      0               logprob of token t      0

so position ``t`` of a logprob tensor holds the log-probability of ``input_ids[t]`` given the
tokens before it, matching :class:`~forge.types.TrainBatch`. A multi-turn episode's
``loss_mask`` replaces the ``response`` row's 1s (environment and template tokens get 0).
An episode with ``row_starts`` (history windows) becomes one row per turn (``split_rows``),
each with its own prompt, so a batch may hold more rows than episodes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import torch

from forge.types import Episode, TopKTargets, TrainBatch

__all__ = ["collate_episodes", "join_rows", "split_rows", "topk_targets"]


def collate_episodes(episodes: Sequence[Episode], pad_id: int = 0) -> TrainBatch:
    """Pad ``episodes`` into a :class:`TrainBatch` (tensors on CPU).

    Dtypes: ids and ``attention_mask_bt`` int64 (what HF models take); ``response_mask_bt``,
    logprobs and ``advantages_b`` float32 (masks multiply losses; ``[B, T]`` when an episode
    has ``token_advantages``); ``policy_versions_b``
    int64; ``rewards_b`` float32. ``ref_logprobs_bt`` is filled only when every episode has ``ref_logprobs``.
    """
    if not episodes:
        raise ValueError("collate_episodes needs at least one episode, got an empty list")
    for ep in episodes:
        _check_lengths(ep)
    split = [split_rows(ep) for ep in episodes]
    owner = [i for i, rows in enumerate(split) for _ in rows]
    windowed = len(owner) > len(episodes)
    episodes = [row for rows in split for row in rows]
    with_ref = all(ep.ref_logprobs is not None for ep in episodes)
    per_token = any(ep.token_advantages is not None for ep in episodes)
    batch, seq = len(episodes), max(ep.num_tokens for ep in episodes)
    input_ids_bt = torch.full((batch, seq), pad_id, dtype=torch.long)
    attention_mask_bt = torch.zeros((batch, seq), dtype=torch.long)
    response_mask_bt = torch.zeros((batch, seq), dtype=torch.float32)
    behavior_logprobs_bt = torch.zeros((batch, seq), dtype=torch.float32)
    ref_logprobs_bt = torch.zeros((batch, seq), dtype=torch.float32) if with_ref else None
    advantages = torch.tensor([ep.advantage for ep in episodes], dtype=torch.float32)
    if per_token:  # [B, T]: each row's token advantages, or its one advantage broadcast
        advantages = advantages.unsqueeze(-1).repeat(1, seq)
    for b, ep in enumerate(episodes):
        p, n = len(ep.prompt_ids), ep.num_tokens
        input_ids_bt[b, :n] = torch.tensor(ep.prompt_ids + ep.response_ids, dtype=torch.long)
        attention_mask_bt[b, :n] = 1
        if ep.loss_mask is None:
            response_mask_bt[b, p:n] = 1.0
        else:  # multi-turn: only the tokens the policy sampled count
            response_mask_bt[b, p:n] = torch.tensor(ep.loss_mask, dtype=torch.float32)
        behavior_logprobs_bt[b, p:n] = torch.tensor(ep.behavior_logprobs, dtype=torch.float32)
        if ref_logprobs_bt is not None:
            ref_logprobs_bt[b, p:n] = torch.tensor(ep.ref_logprobs, dtype=torch.float32)
        if per_token and ep.token_advantages is not None:
            advantages[b, :p] = 0.0
            advantages[b, p:n] = torch.tensor(ep.token_advantages, dtype=torch.float32)
            advantages[b, n:] = 0.0
    return TrainBatch(
        input_ids_bt=input_ids_bt,
        attention_mask_bt=attention_mask_bt,
        response_mask_bt=response_mask_bt,
        behavior_logprobs_bt=behavior_logprobs_bt,
        advantages_b=advantages,
        ref_logprobs_bt=ref_logprobs_bt,
        policy_versions_b=torch.tensor([ep.policy_version for ep in episodes], dtype=torch.long),
        rewards_b=torch.tensor([ep.reward for ep in episodes], dtype=torch.float32),
        bootstrap_at_b=torch.tensor(
            [-1 if ep.bootstrap_at is None else ep.bootstrap_at for ep in episodes],
            dtype=torch.long,
        ),
        turn_rewards=(
            [list(ep.turn_rewards) for ep in episodes]
            if all(ep.turn_rewards is not None for ep in episodes)
            else None
        ),
        row_episode_b=torch.tensor(owner, dtype=torch.long) if windowed else None,
        teacher_topk=topk_targets(episodes, seq),
    )


def topk_targets(episodes: Sequence[Episode], seq: int) -> TopKTargets | None:
    """The GKD targets of ``episodes`` (rows of one batch, width ``seq``), laid out as
    ``TopKTargets`` says; ``None`` when no episode has ``teacher_topk``."""
    if all(ep.teacher_topk is None for ep in episodes):
        return None
    k = max(
        (len(row) for ep in episodes if ep.teacher_topk for row in ep.teacher_topk.ids), default=1
    )
    ids_btk = torch.zeros((len(episodes), seq, k), dtype=torch.long)
    logprobs_btk = torch.full((len(episodes), seq, k), float("-inf"), dtype=torch.float32)
    beta_b = torch.zeros(len(episodes), dtype=torch.float32)
    coef_b = torch.zeros(len(episodes), dtype=torch.float32)
    for b, ep in enumerate(episodes):
        top = ep.teacher_topk
        if top is None:
            continue
        r, p = len(ep.response_ids), len(ep.prompt_ids)
        if len(top.ids) != r or len(top.logprobs) != r:
            raise ValueError(
                f"episode {ep.episode_id!r} has {r} response tokens but teacher top-k for "
                f"{len(top.ids)} ids / {len(top.logprobs)} logprobs rows; one per token"
            )
        for t, (ids, lps) in enumerate(zip(top.ids, top.logprobs)):
            ids_btk[b, p + t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logprobs_btk[b, p + t, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
        beta_b[b], coef_b[b] = top.beta, top.coef
    return TopKTargets(ids_btk, logprobs_btk, beta_b, coef_b)


def split_rows(ep: Episode) -> list[Episode]:
    """An episode with ``row_starts`` as one episode per row (``[ep]`` without): row ``k``'s
    prompt is its tokens before its first sampled one, its response the rest up to the next
    row; per-token fields are cut alike. Rows keep the episode's reward, advantage and
    version; each row's ``turn_rewards`` are those of its turn (none if it sampled nothing),
    and ``bootstrap_at`` (a position in one sequence) is dropped."""
    if not ep.row_starts:
        return [ep]
    if ep.loss_mask is None:
        raise ValueError(f"episode {ep.episode_id!r} has row_starts but no loss_mask")
    bounds = [0, *ep.row_starts, len(ep.response_ids)]
    rewards = list(ep.turn_rewards) if ep.turn_rewards is not None else None
    rows = []
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        if k == 0:
            prompt, cut = list(ep.prompt_ids), a
        else:
            sampled = [i for i in range(a, b) if ep.loss_mask[i]]
            cut = sampled[0] if sampled else b
            prompt = ep.response_ids[a:cut]

        part = functools.partial(_cut, start=cut, end=b)
        turn_rewards = None
        if rewards is not None:  # one reward per turn that sampled tokens
            turn_rewards = [rewards.pop(0)] if any(ep.loss_mask[cut:b]) and rewards else []
        rows.append(
            dataclasses.replace(
                ep,
                episode_id=f"{ep.episode_id}/{k}",
                prompt_ids=prompt,
                response_ids=part(ep.response_ids),
                behavior_logprobs=part(ep.behavior_logprobs),
                loss_mask=part(ep.loss_mask),
                token_advantages=part(ep.token_advantages),
                ref_logprobs=part(ep.ref_logprobs),
                turn_rewards=turn_rewards,
                bootstrap_at=None,
                row_starts=None,
            )
        )
    return rows


def _cut(values, start: int, end: int):
    return None if values is None else list(values[start:end])


def join_rows(rows: list[Episode], row_values: list[list[float]]) -> list[float]:
    """Per-token values of the responses of ``rows`` (one episode's ``split_rows``) laid back
    on the episode's ``response_ids`` (0.0 on each later row's prompt)."""
    if len(row_values) != len(rows):
        raise ValueError(f"{len(rows)} rows but {len(row_values)} lists of values")
    out: list[float] = []
    for k, (row, values) in enumerate(zip(rows, row_values)):
        if k:
            out += [0.0] * len(row.prompt_ids)
        out += list(values)
    return out


def _check_lengths(ep: Episode) -> None:
    r = len(ep.response_ids)
    starts = list(ep.row_starts or [])
    if starts and (starts != sorted(set(starts)) or starts[0] <= 0 or starts[-1] >= r):
        raise ValueError(
            f"episode {ep.episode_id!r}: row_starts {starts} must rise strictly inside its "
            f"{r} response tokens"
        )
    if len(ep.behavior_logprobs) != r:
        raise ValueError(
            f"episode {ep.episode_id!r} has {r} response tokens but "
            f"{len(ep.behavior_logprobs)} behavior_logprobs; they must be one per token"
        )
    if ep.token_advantages is not None and len(ep.token_advantages) != r:
        raise ValueError(
            f"episode {ep.episode_id!r} has {r} response tokens but "
            f"{len(ep.token_advantages)} token_advantages; they must be one per token"
        )
    if ep.loss_mask is not None and len(ep.loss_mask) != r:
        raise ValueError(
            f"episode {ep.episode_id!r} has {r} response tokens but {len(ep.loss_mask)} "
            "loss_mask entries; they must be one per token"
        )
    if ep.ref_logprobs is not None and len(ep.ref_logprobs) != r:
        raise ValueError(
            f"episode {ep.episode_id!r} has {r} response tokens but "
            f"{len(ep.ref_logprobs)} ref_logprobs; they must be one per token"
        )
