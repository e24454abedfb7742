"""PPO with a learned value function: token rewards, GAE over tokens, the clipped value loss.

Layout (that of :class:`~forge.types.TrainBatch`): position ``t`` of a ``[B, T]`` tensor
belongs to the action "emit ``input_ids[t]``", taken in the state "tokens ``< t``". So
``values_bt[t]`` is the critic's estimate of the return from that state (see
``forge.training.value_model``), aligned with ``logprobs_bt[t]``, and ``rewards_bt[t]`` is the
reward received for emitting token ``t``.

Only *counted* tokens (``mask_bt == 1``) are steps of the MDP. Positions with mask 0 are
transparent: in a multi-turn trajectory the environment's tokens between two assistant turns
are part of the next state, not steps of their own, so the "next state" of the last token of
turn k is the first counted token of turn k+1. After the last counted token the episode ends
(value 0). With ``gamma`` the discount per counted token and ``lam`` GAE's lambda::

    delta_t = r_t + gamma * V_next(t) - V_t          V_next(t) = V at the next counted token
    A_t     = delta_t + gamma * lam * A_next(t)       (0 after the last counted token)
    R_t     = A_t + V_t                               the value target ("returns")

``gamma = lam = 1`` with a terminal reward ``R`` gives ``A_t = R - V_t`` at every token.
"""

from __future__ import annotations

import torch

from forge.losses.normalize import aggregate, masked_mean, masked_values
from forge.types import TrainBatch

__all__ = [
    "clipped_value_loss",
    "explained_variance",
    "gae_advantages",
    "ppo_advantages_for_batch",
    "token_rewards_bt",
    "turn_gae_advantages",
    "turn_rewards_bt",
    "whiten",
    "whiten_together",
]

Metrics = dict[str, float]


def _check_same_shape(mask_bt: torch.Tensor, **tensors_bt: torch.Tensor) -> None:
    if mask_bt.dim() != 2:
        raise ValueError(f"mask_bt must be 2-D [B, T], got shape {tuple(mask_bt.shape)}")
    for name, t in tensors_bt.items():
        if t.shape != mask_bt.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but mask_bt has {tuple(mask_bt.shape)}"
            )


def _turn_ends_bt(mask_bt: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, T]``: True on the last counted token of each run of counted tokens."""
    on_bt = mask_bt > 0
    next_on_bt = torch.zeros_like(on_bt)
    next_on_bt[:, :-1] = on_bt[:, 1:]
    return on_bt & ~next_on_bt


def token_rewards_bt(rewards_b: torch.Tensor, mask_bt: torch.Tensor) -> torch.Tensor:
    """Sparse terminal rewards: ``rewards_b[b]`` on row b's last counted token, 0 elsewhere.

    A row with no counted token gets no reward (all zeros). Float32 ``[B, T]`` on the mask's
    device.
    """
    rewards_b = torch.as_tensor(rewards_b, dtype=torch.float32, device=mask_bt.device)
    if rewards_b.dim() != 1 or mask_bt.dim() != 2 or rewards_b.shape[0] != mask_bt.shape[0]:
        raise ValueError(
            f"rewards_b must be [B] and mask_bt [B, T] with the same B, got "
            f"{tuple(rewards_b.shape)} and {tuple(mask_bt.shape)}"
        )
    on_bt = mask_bt > 0
    width = mask_bt.shape[1]
    # Index of the last True per row: the first True of the row read backwards.
    last_b = width - 1 - on_bt.flip(-1).int().argmax(dim=-1)
    out_bt = torch.zeros(mask_bt.shape, dtype=torch.float32, device=mask_bt.device)
    has_b = on_bt.any(dim=-1)
    rows_b = torch.arange(mask_bt.shape[0], device=mask_bt.device)
    out_bt[rows_b[has_b], last_b[has_b]] = rewards_b[has_b]
    return out_bt


def turn_rewards_bt(rewards: list[list[float]], mask_bt: torch.Tensor) -> torch.Tensor:
    """Per-turn rewards: ``rewards[b][k]`` on the last token of row b's k-th run of counted
    tokens (its k-th assistant turn), 0 elsewhere.

    Each row must list exactly one reward per run of 1s in its mask. ``[[r]]`` per row with a
    single turn is the same as ``token_rewards_bt``.
    """
    if mask_bt.dim() != 2 or len(rewards) != mask_bt.shape[0]:
        raise ValueError(
            f"turn_rewards_bt needs one list of rewards per row of mask_bt "
            f"{tuple(mask_bt.shape)}, got {len(rewards)} lists"
        )
    ends_bt = _turn_ends_bt(mask_bt)
    out_bt = torch.zeros(mask_bt.shape, dtype=torch.float32, device=mask_bt.device)
    for b, row in enumerate(rewards):
        ends = ends_bt[b].nonzero().flatten()
        if len(row) != ends.numel():
            raise ValueError(
                f"row {b} has {ends.numel()} turns (runs of counted tokens) but {len(row)} "
                "rewards; pass one reward per turn"
            )
        if ends.numel():
            out_bt[b, ends] = torch.tensor(row, dtype=torch.float32, device=mask_bt.device)
    return out_bt


def gae_advantages(
    rewards_bt: torch.Tensor,
    values_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the counted tokens of each row; returns ``(advantages_bt, returns_bt)``.

    See the module docstring for the recursion. Masked positions are skipped (their rewards
    must be 0: a reward there would be silently lost, so it is an error) and hold 0 in both
    outputs. Float32, no grad (values are detached), vectorised over rows, looping over ``T``.
    """
    _check_same_shape(mask_bt, rewards_bt=rewards_bt, values_bt=values_bt)
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    on_bt = mask_bt > 0
    rewards_bt = rewards_bt.detach().float()
    values_bt = values_bt.detach().float()
    if (rewards_bt[~on_bt] != 0).any():
        raise ValueError(
            "rewards_bt is nonzero at positions where mask_bt is 0; put each reward on a "
            "counted token (token_rewards_bt / turn_rewards_bt do)"
        )
    advantages_bt = torch.zeros_like(values_bt)
    next_value_b = values_bt.new_zeros(values_bt.shape[0])  # V after the last token: 0
    next_adv_b = values_bt.new_zeros(values_bt.shape[0])
    for t in range(values_bt.shape[1] - 1, -1, -1):
        on_b = on_bt[:, t]
        delta_b = rewards_bt[:, t] + gamma * next_value_b - values_bt[:, t]
        adv_b = delta_b + gamma * lam * next_adv_b
        # Masked positions leave the carried "next" state untouched: they are transparent.
        next_adv_b = torch.where(on_b, adv_b, next_adv_b)
        next_value_b = torch.where(on_b, values_bt[:, t], next_value_b)
        advantages_bt[:, t] = torch.where(on_b, adv_b, 0.0)
    returns_bt = torch.where(on_bt, advantages_bt + values_bt, 0.0)
    return advantages_bt, returns_bt


def _turn_runs(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """``[(start, end)]`` (end exclusive) of each run of counted tokens in one row."""
    on = mask_row > 0
    before = torch.zeros_like(on)
    before[1:] = on[:-1]
    starts = (on & ~before).nonzero().flatten().tolist()
    ends = _turn_ends_bt(mask_row.unsqueeze(0))[0].nonzero().flatten().tolist()
    return [(s, e + 1) for s, e in zip(starts, ends)]


def turn_gae_advantages(
    turn_rewards: list[list[float]],
    values_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    bootstrap_at_b: torch.Tensor | None = None,
    row_episode_b: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the *turns* of each row; returns ``(advantages_bt, returns_bt)``.

    A turn is a run of counted tokens (an assistant turn of a multi-turn episode). Turn
    ``k``'s state value ``V_k`` is ``values_bt`` at its first counted token: the critic's
    estimate after reading everything before the turn (the last prompt token of the turn's
    context). With ``r_k = turn_rewards[b][k]`` and ``V_K = 0`` after the last turn (or, for a
    row cut short, ``V_K = values_bt[b, bootstrap_at_b[b]]`` when that index is >= 0: the
    value of the state the episode was cut in)::

        delta_k = r_k + gamma * V_{k+1} - V_k
        A_k     = delta_k + gamma * lam * A_{k+1}
        R_k     = A_k + V_k

    ``A_k`` is laid on every token of turn ``k`` (a turn's tokens share its credit) and so is
    ``R_k``, the value target of the turn's positions. ``gamma`` discounts per turn, not per
    token. Masked positions hold 0. Each row needs one reward per turn.

    With ``row_episode_b`` (history windows: each turn its own row, ``TrainBatch``) the rows
    of one episode, in order, are its turns: the recursion runs across them, and turn ``k``'s
    ``V_k`` is read in its own row (the value of its window).
    """
    _check_same_shape(mask_bt, values_bt=values_bt)
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    if len(turn_rewards) != mask_bt.shape[0]:
        raise ValueError(
            f"turn_gae_advantages needs one list of turn rewards per row of mask_bt "
            f"{tuple(mask_bt.shape)}, got {len(turn_rewards)}"
        )
    values_bt = values_bt.detach().float()
    advantages_bt = torch.zeros_like(values_bt)
    returns_bt = torch.zeros_like(values_bt)
    for rows in _episodes(row_episode_b, len(turn_rewards)):
        runs = [(b, start, end) for b in rows for start, end in _turn_runs(mask_bt[b])]
        rewards = [r for b in rows for r in turn_rewards[b]]
        if len(runs) != len(rewards):
            raise ValueError(
                f"row(s) {rows} have {len(runs)} turns (runs of counted tokens) but "
                f"{len(rewards)} turn rewards; pass one reward per turn that sampled tokens"
            )
        next_v = next_a = 0.0
        last = rows[-1]
        if bootstrap_at_b is not None and int(bootstrap_at_b[last]) >= 0:
            next_v = float(values_bt[last, int(bootstrap_at_b[last])])
        for (b, start, end), r in zip(reversed(runs), reversed(rewards)):
            v = float(values_bt[b, start])
            a = float(r) + gamma * next_v - v + gamma * lam * next_a
            on = mask_bt[b, start:end] > 0
            advantages_bt[b, start:end] = torch.where(on, a, 0.0)
            returns_bt[b, start:end] = torch.where(on, a + v, 0.0)
            next_v, next_a = v, a
    return advantages_bt, returns_bt


def _episodes(row_episode_b: torch.Tensor | None, rows: int) -> list[list[int]]:
    """The rows of each episode, in order: one row each without ``row_episode_b``."""
    if row_episode_b is None:
        return [[b] for b in range(rows)]
    if len(row_episode_b) != rows:
        raise ValueError(f"row_episode_b has {len(row_episode_b)} entries for {rows} rows")
    grouped: dict[int, list[int]] = {}
    for b, e in enumerate(row_episode_b.tolist()):
        grouped.setdefault(int(e), []).append(b)
    return list(grouped.values())


def whiten(
    advantages_bt: torch.Tensor, mask_bt: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """``(A - mean) / (std + eps)`` over the counted tokens (population std); 0 where masked.

    ``shift_mean=False`` only rescales (keeps the sign of every advantage).
    """
    _check_same_shape(mask_bt, advantages_bt=advantages_bt)
    mean = masked_mean(advantages_bt, mask_bt)
    var = masked_mean((advantages_bt - mean) ** 2, mask_bt)
    out_bt = (advantages_bt - mean) if shift_mean else advantages_bt
    out_bt = out_bt / (var.sqrt() + eps)
    return torch.where(mask_bt > 0, out_bt, torch.zeros_like(out_bt))


def whiten_together(
    advantages: list[torch.Tensor], masks: list[torch.Tensor], eps: float = 1e-8
) -> list[torch.Tensor]:
    """``whiten`` over the counted tokens of several ``[B_i, T_i]`` batches at once (one
    mean and std for all, e.g. a step's per-rank batches), each returned in its own shape."""
    width = max(a.shape[1] for a in advantages)
    pad = torch.nn.functional.pad
    adv_bt = torch.cat([pad(a, (0, width - a.shape[1])) for a, m in zip(advantages, masks)])
    mask_bt = torch.cat([pad(m.to(adv_bt.dtype), (0, width - m.shape[1])) for m in masks])
    out_bt = whiten(adv_bt, mask_bt, eps=eps)
    pieces, start = [], 0
    for a in advantages:
        pieces.append(out_bt[start : start + a.shape[0], : a.shape[1]])
        start += a.shape[0]
    return pieces


def explained_variance(
    values_bt: torch.Tensor, returns_bt: torch.Tensor, mask_bt: torch.Tensor
) -> float:
    """``1 - Var(R - V) / Var(R)`` over counted tokens: 1 is a perfect critic, 0 is no better
    than a constant, negative is worse. 0.0 when the returns have no variance."""
    values_bt, returns_bt = values_bt.detach().float(), returns_bt.detach().float()
    r_mean = masked_mean(returns_bt, mask_bt)
    var_r = masked_mean((returns_bt - r_mean) ** 2, mask_bt)
    err_bt = returns_bt - values_bt
    var_err = masked_mean((err_bt - masked_mean(err_bt, mask_bt)) ** 2, mask_bt)
    if var_r.item() < 1e-12:  # constant returns: the ratio is undefined
        return 0.0
    return float(1.0 - var_err / var_r)


def clipped_value_loss(
    values_bt: torch.Tensor,
    old_values_bt: torch.Tensor,
    returns_bt: torch.Tensor,
    mask_bt: torch.Tensor,
    clip_eps: float | None = 0.2,
    aggregation: str = "token_mean",
    max_tokens: int | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO's clipped value loss, per token

        0.5 * max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2)

    reduced by ``forge.losses.normalize.aggregate``. ``clip_eps=None`` gives plain
    ``0.5 * (V - R)^2``. ``old_values_bt`` and ``returns_bt`` are constants (detached).

    Metrics: ``value_loss``; ``value_clip_fraction`` (counted tokens where the clipped term is
    the larger, so the gradient is zero); ``explained_variance``; ``value_mean`` and
    ``return_mean`` over counted tokens.
    """
    _check_same_shape(
        mask_bt, values_bt=values_bt, old_values_bt=old_values_bt, returns_bt=returns_bt
    )
    if clip_eps is not None and clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0 or None, got {clip_eps}")
    # Masked positions become 0 before any arithmetic: their values (even inf or NaN) can
    # then change neither the loss nor, through a NaN * 0 in the backward, the gradient.
    values_bt, old_values_bt, returns_bt = (
        masked_values(x, mask_bt) for x in (values_bt, old_values_bt.detach(), returns_bt.detach())
    )
    loss_bt = (values_bt - returns_bt) ** 2
    clipped_bt = torch.zeros_like(mask_bt, dtype=torch.bool)
    if clip_eps is not None:
        v_clip_bt = old_values_bt + (values_bt - old_values_bt).clamp(-clip_eps, clip_eps)
        loss_clip_bt = (v_clip_bt - returns_bt) ** 2
        with torch.no_grad():
            clipped_bt = loss_clip_bt > loss_bt
        loss_bt = torch.maximum(loss_bt, loss_clip_bt)
    loss = aggregate(0.5 * loss_bt, mask_bt, aggregation, max_tokens)
    with torch.no_grad():
        metrics: Metrics = {
            "value_loss": loss.item(),
            "value_clip_fraction": masked_mean(clipped_bt.float(), mask_bt).item(),
            "explained_variance": explained_variance(values_bt, returns_bt, mask_bt),
            "value_mean": masked_mean(values_bt.float(), mask_bt).item(),
            "return_mean": masked_mean(returns_bt.float(), mask_bt).item(),
        }
    return loss, metrics


def ppo_advantages_for_batch(
    batch: TrainBatch,
    rewards_b: torch.Tensor,
    values_bt: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    *,
    whiten_advantages: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages_bt, returns_bt)`` for a collated batch with one terminal reward per row.

    Call between ``Critic.values(batch)`` (which gives ``values_bt``) and the policy update:
    set ``batch.advantages_b = advantages_bt`` (the ``ppo`` loss takes ``[B, T]``) and pass
    ``returns_bt`` and ``values_bt`` (as ``old_values_bt``) to ``Critic.train_step``.
    ``whiten_advantages`` normalises the advantages over the batch's counted tokens; the
    returns are always the unwhitened ``A + V``. CPU float32 like the batch.
    """
    mask_bt = batch.response_mask_bt
    values_bt = values_bt.to(mask_bt.device)
    rewards_bt = token_rewards_bt(rewards_b, mask_bt)
    advantages_bt, returns_bt = gae_advantages(rewards_bt, values_bt, mask_bt, gamma, lam)
    if whiten_advantages:
        advantages_bt = whiten(advantages_bt, mask_bt)
    return advantages_bt, returns_bt
