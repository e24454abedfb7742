"""Teacher-forced per-token logprobs and the padded batch layout shared by trainer and reference.

Layout: ``input_ids_bt`` is prompt + response per row, right-padded. Logprob tensors are aligned
with it: position t holds log p(token_t | tokens_<t); position 0 and padding hold 0. The
generator reports logprobs under the same convention (temperature applied, before top-k/top-p
filtering), so ``token_logprobs(model, ..., temperature=T)`` recomputes them exactly.
"""

from __future__ import annotations

import contextlib
import types

import torch

# Tokens per chunk when projecting hidden states to the vocabulary: bounds the fp32
# [B, chunk, V] logits alive at once (large for 150k-entry vocabularies).
DEFAULT_CHUNK_TOKENS = 1024
# Logit elements computed at once (fp32: 512 MB) by ``head_logprobs``: past it, positions go
# through the head in pieces, each recomputed in the backward instead of kept for it.
HEAD_CHUNK_ELEMENTS = 1 << 27


def position_ids_from_mask(attention_mask_bt: torch.Tensor) -> torch.Tensor:
    """Positions counting only attended tokens, so left padding does not shift RoPE.

    Padding positions get 0 (they are masked out anyway).
    """
    mask_bt = attention_mask_bt.long()
    return ((mask_bt.cumsum(-1) - 1) * mask_bt).clamp(min=0)


def effective_temperature(temperature: float) -> float:
    """Temperature 0 (greedy) reports logprobs of the unscaled distribution (temperature 1)."""
    return temperature if temperature > 0 else 1.0


# cross_entropy skips targets equal to its ignore_index; no token id is this one.
_NO_IGNORE = torch.iinfo(torch.long).min


def gather_logprobs(logits_btv: torch.Tensor, targets_bt: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[target] in fp32 (any leading shape). Computed as minus the
    per-token cross-entropy: PyTorch's fused log-softmax + NLL kernels took 0.60 s forward
    and backward at [3000, 49152] on 2 CPU threads against 1.05 s for gather minus
    ``logsumexp`` (the same values within float32 rounding, docs/performance.md)."""
    logits_nv = logits_btv.float().reshape(-1, logits_btv.shape[-1])
    nll_n = torch.nn.functional.cross_entropy(
        logits_nv, targets_bt.reshape(-1), reduction="none", ignore_index=_NO_IGNORE
    )
    return -nll_n.view(targets_bt.shape)


def head_logits(head: torch.nn.Module, hidden_btd: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` in float32, also under autocast, unless the head was left to
    autocast (``set_head_precision(model, autocast_head=True)``): bf16
    logits are off by up to ~0.1 nats at logit magnitudes of 20, which shows in every ratio."""
    kind = hidden_btd.device.type
    if torch.is_autocast_enabled(kind) and not getattr(head, _AUTOCAST_HEAD, False):
        with torch.autocast(kind, enabled=False):
            return head(hidden_btd.float())
    return head(hidden_btd)


def head_logprobs(
    head: torch.nn.Module,
    hidden_nd: torch.Tensor,
    targets_n: torch.Tensor,
    temperature: float = 1.0,
    chunk_elements: int = HEAD_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """log softmax(head(hidden) / temperature)[target] per position, fp32 ``[N]``; with
    ``targets_n`` of shape ``[N, J]``, the logprobs of the ``J`` ids at each position, ``[N, J]``.

    The ``[N, vocab]`` logits are the largest tensors of a step for a big vocabulary (262,144
    entries: 1 MB per position in fp32, and autograd keeps several copies per position for
    the backward). Above ``chunk_elements`` logit elements the positions go through the head
    in pieces of ``chunk_elements // vocab``; under grad each piece is checkpointed (its
    logits recomputed in the backward), so one piece's logits are alive at a time. The values
    and gradients are those of one pass."""
    vocab = head.weight.shape[0]
    rows = max(1, chunk_elements // vocab)

    def piece(h_nd: torch.Tensor, t_n: torch.Tensor) -> torch.Tensor:
        logits_nv = head_logits(head, h_nd).float()
        if temperature != 1.0:  # (a full pass over [N, vocab], forward and backward)
            logits_nv = logits_nv / temperature
        if t_n.dim() == 2:  # several ids per position: one log-normaliser for them all
            return logits_nv.gather(-1, t_n) - torch.logsumexp(logits_nv, -1, keepdim=True)
        return gather_logprobs(logits_nv, t_n)

    n = hidden_nd.shape[0]
    if n <= rows:
        return piece(hidden_nd, targets_n)
    grad = torch.is_grad_enabled() and hidden_nd.requires_grad
    out = []
    for start in range(0, n, rows):
        h, t = hidden_nd[start : start + rows], targets_n[start : start + rows]
        if grad:
            out.append(torch.utils.checkpoint.checkpoint(piece, h, t, use_reentrant=False))
        else:
            out.append(piece(h, t))
    return torch.cat(out)


_AUTOCAST_HEAD = "_forge_autocast_head"  # set on a head left to autocast on purpose


def _float32_forward(self: torch.nn.Module, hidden: torch.Tensor, *args, **kwargs):
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        with torch.autocast(kind, enabled=False):
            return type(self).forward(self, hidden.float(), *args, **kwargs)
    return type(self).forward(self, hidden, *args, **kwargs)


def output_head(model) -> torch.nn.Module | None:
    """The module that turns hidden states into logits (HF's output embeddings, or an
    ``lm_head`` attribute), or ``None``."""
    inner = getattr(model, "module", model)  # DDP
    get = getattr(inner, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if head is not None else getattr(inner, "lm_head", None)


def set_head_precision(model, autocast_head: bool) -> None:
    """Under autocast, run ``model``'s LM head in float32 (``autocast_head=False``: float32
    input, autocast off inside it) wherever it is called: the chunked head of
    ``token_logprobs``, the model's own forward (DDP, FSDP, titan) and the shared-prefix
    pass, so one rank and several compute the same logits. ``autocast_head=True`` leaves it
    to autocast (bf16 logits, as TRL and verl compute them under mixed precision): the
    head's three matmuls then run in bf16, at the price of a larger trainer/generator
    mismatch (docs/performance.md). Raises if a float32 head is asked for and none is found."""
    head = output_head(model)
    if head is None:
        if autocast_head:  # nothing to change: the model's forward runs under autocast
            return
        raise ValueError(
            f"{type(model).__name__} has no output embeddings or lm_head to keep in float32; "
            "drop trainer.autocast, or set trainer.autocast_head: true"
        )
    object.__setattr__(head, _AUTOCAST_HEAD, autocast_head)
    if autocast_head:
        head.__dict__.pop("forward", None)  # the class's own forward again
    else:
        head.forward = types.MethodType(_float32_forward, head)


# Token positions of the probe that checks the chunked head against the model's forward.
_PROBE_TOKENS = 6
_CHECKED = "_forge_split_head_ok"  # attribute caching the check's result on the model


def _body_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    body = getattr(model, "model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or head is None:
        return None
    return body, head


@torch.no_grad()
def split_head_matches(model, tokens: int = _PROBE_TOKENS) -> bool:
    """Whether ``head(body(x).last_hidden_state)`` equals ``model(x).logits`` on a few tokens.

    The chunked path of ``token_logprobs`` projects the body's hidden states with the output
    embedding itself, so any post-processing the model's own forward applies to its logits
    (Granite's ``logits / logits_scaling``, a ``lm_head_multiplier``, soft-capping, ...)
    would be silently dropped. Instead of a list of architectures, this runs both paths on
    ``tokens`` token ids in eval mode and compares (float tolerance of the model's dtype).
    The model's train/eval mode is restored.
    """
    parts = _body_and_head(model)
    if parts is None:
        return False
    body, head = parts
    param = next(model.parameters())
    vocab = int(getattr(model.config, "vocab_size", 0) or head.weight.shape[0])
    gen = torch.Generator().manual_seed(0)
    ids_bt = torch.randint(0, max(vocab, 1), (1, tokens), generator=gen).to(param.device)
    mask_bt = torch.ones_like(ids_bt)
    stack = contextlib.ExitStack()
    was_training = model.training
    model.eval()
    try:  # in the parameters' own precision, whatever autocast the caller runs under
        stack.enter_context(torch.autocast(param.device.type, enabled=False))
        pos_bt = position_ids_from_mask(mask_bt)
        full = model(input_ids=ids_bt, attention_mask=mask_bt, position_ids=pos_bt).logits
        hidden = body(input_ids=ids_bt, attention_mask=mask_bt, position_ids=pos_bt)
        split = head(hidden.last_hidden_state)
    finally:
        stack.close()
        model.train(was_training)
    full, split = full.float(), split.float()
    if full.shape != split.shape:
        return False
    tol = 1e-4 if param.dtype == torch.float32 else 2e-2
    scale = float(full.abs().max().clamp(min=1.0))
    return bool((full - split).abs().max() <= tol * scale)


def check_split_head(model) -> bool:
    """Run ``split_head_matches`` once per model and remember the answer on it; called at
    load (``forge.models.load_model``) and lazily by ``token_logprobs`` for models built
    otherwise. Returns whether the chunked head path is used."""
    ok = getattr(model, _CHECKED, None)
    if ok is None:
        ok = split_head_matches(model)
        object.__setattr__(model, _CHECKED, ok)
    return ok


def _split_head(model) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder body, lm_head) if logits can be made in chunks from them exactly as the
    model's forward makes them (``check_split_head``); ``None``: use the full forward."""
    parts = _body_and_head(model)
    # Soft-capping is the identity on small logits, which a probe of an untrained model may
    # not reach: the config states it, so take its word.
    capped = getattr(model.config, "final_logit_softcapping", None)
    if parts is None or capped or not check_split_head(model):
        return None
    return parts


def token_logprobs(
    model,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    temperature: float = 1.0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Per-token logprobs ``[B, T]`` (fp32) of ``input_ids_bt`` under ``model``.

    Position t holds log softmax(logits_{t-1} / temperature)[token_t]; position 0 and
    positions with ``attention_mask_bt == 0`` hold 0. Works for left or right padding
    (position ids come from the mask). Differentiable: the trainer calls it under grad.
    """
    temp = effective_temperature(temperature)
    split = _split_head(model)
    elements = HEAD_CHUNK_ELEMENTS
    if split is not None:
        elements = min(elements, input_ids_bt.shape[0] * chunk_tokens * split[1].weight.shape[0])
    lp_bt = _picked(
        model, split, input_ids_bt, attention_mask_bt, input_ids_bt[:, 1:], temp, elements
    )
    lp_bt = torch.cat([lp_bt.new_zeros(lp_bt.shape[0], 1), lp_bt], dim=1)
    return _only_scored(lp_bt, attention_mask_bt)


def token_and_topk_logprobs(
    model,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    ids_btk: torch.Tensor,
    temperature: float = 1.0,
    chunked: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs`` and, from the same forward, ``[B, T, K]`` fp32: at position ``t`` the
    logprobs (at ``temperature``) of the ids ``ids_btk[:, t]`` as predictions of token ``t``
    (made at ``t - 1``); position 0 holds 0. One pass of the body; the head goes in the
    checkpointed pieces of ``head_logprobs`` where the model splits and ``chunked`` (a wrapped
    model, DDP or FSDP, needs its own forward: ``chunked=False``), else ``[B, T, vocab]``
    logits."""
    targets_btj = torch.cat([input_ids_bt[:, 1:, None], ids_btk[:, 1:]], -1)
    split = _split_head(model) if chunked else None
    temp = effective_temperature(temperature)
    picked_btj = _picked(model, split, input_ids_bt, attention_mask_bt, targets_btj, temp)
    picked_btj = torch.nn.functional.pad(picked_btj, (0, 0, 1, 0))
    return _only_scored(picked_btj[..., 0], attention_mask_bt), picked_btj[..., 1:]


def _picked(
    model,
    split,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    targets: torch.Tensor,
    temp: float,
    elements: int = HEAD_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """The logprobs at ``temp`` of ``targets`` (``[B, T - 1]``, or ``[B, T - 1, J]``: several
    ids per position) as predictions made at positions ``0 .. T - 2``: from the model's own
    logits (``split`` ``None``), or from its body and head (``split``: ``(body, head)``), the
    head in ``head_logprobs``' pieces of ``elements`` logits."""
    position_ids_bt = position_ids_from_mask(attention_mask_bt)
    if split is None:
        out = model(
            input_ids=input_ids_bt, attention_mask=attention_mask_bt, position_ids=position_ids_bt
        )
        logits_btv = out.logits[:, :-1].float() / temp
        if targets.dim() == 2:
            return gather_logprobs(logits_btv, targets)
        return logits_btv.gather(-1, targets) - logits_btv.logsumexp(-1, keepdim=True)
    body, head = split
    hidden_btd = body(
        input_ids=input_ids_bt, attention_mask=attention_mask_bt, position_ids=position_ids_bt
    ).last_hidden_state[:, :-1]
    b, t, d = hidden_btd.shape
    per_row = targets.reshape(b * t, *targets.shape[2:])
    return head_logprobs(head, hidden_btd.reshape(b * t, d), per_row, temp, elements).view(
        b, t, *targets.shape[2:]
    )


def _only_scored(x_bt: torch.Tensor, attention_mask_bt: torch.Tensor) -> torch.Tensor:
    """``x_bt`` where a token has a logprob (it and its predecessor are real tokens), else 0."""
    valid_bt = attention_mask_bt.bool().clone()
    valid_bt[:, 1:] &= attention_mask_bt[:, :-1].bool()
    valid_bt[:, 0] = False
    return torch.where(valid_bt, x_bt, torch.zeros_like(x_bt))


@torch.no_grad()
def token_logprobs_entropy(
    model,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    temperature: float = 1.0,
    chunk_elements: int = HEAD_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logprobs_bt, entropy_bt)``, both ``[B, T]`` fp32, no grad: the logprobs of
    ``token_logprobs`` and, at the same positions, the entropy of the distribution each token
    was scored against, ``H(softmax(logits_{t-1} / temperature))`` (0 where the logprob is 0).
    A frozen model's view of given tokens (an OPD teacher's): one log-softmax over each piece
    of at most ``chunk_elements`` logits gives both (with the chunked head, only that piece's
    logits exist at a time, as in ``head_logprobs``)."""
    temp = effective_temperature(temperature)
    position_ids_bt = position_ids_from_mask(attention_mask_bt)
    targets_n = input_ids_bt[:, 1:].reshape(-1)
    inputs = {"input_ids": input_ids_bt, "attention_mask": attention_mask_bt}
    split = _split_head(model)
    if split is None:
        logits_btv = model(**inputs, position_ids=position_ids_bt).logits[:, :-1]
        flat = logits_btv.reshape(-1, logits_btv.shape[-1])
        vocab = flat.shape[-1]

        def logits(rows: slice) -> torch.Tensor:
            return flat[rows]
    else:
        body, head = split
        hidden_btd = body(**inputs, position_ids=position_ids_bt).last_hidden_state[:, :-1]
        flat = hidden_btd.reshape(-1, hidden_btd.shape[-1])
        vocab = head.weight.shape[0]

        def logits(rows: slice) -> torch.Tensor:
            return head_logits(head, flat[rows])

    step = max(1, chunk_elements // vocab)
    lps, ents = [], []
    for start in range(0, flat.shape[0], step):
        rows = slice(start, start + step)
        logp_nv = torch.log_softmax(logits(rows).float() / temp, dim=-1)
        lps.append(logp_nv.gather(-1, targets_n[rows].unsqueeze(-1)).squeeze(-1))
        ents.append(-(logp_nv.exp() * logp_nv).sum(-1))
    out = []
    for pieces in (lps, ents):
        x_bt = torch.cat(pieces).view(input_ids_bt.shape[0], -1)
        x_bt = torch.cat([x_bt.new_zeros(x_bt.shape[0], 1), x_bt], dim=1)
        out.append(_only_scored(x_bt, attention_mask_bt))
    return out[0], out[1]


def pad_and_stack(
    prompt_ids_list: list[list[int]],
    response_ids_list: list[list[int]],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad prompt+response rows into ``(input_ids_bt, attention_mask_bt, response_mask_bt)``.

    ``input_ids_bt`` and ``attention_mask_bt`` are int64; ``response_mask_bt`` is float32 with
    1.0 on response tokens (ready to multiply into per-token losses).
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(
            f"pad_and_stack got {len(prompt_ids_list)} prompts but "
            f"{len(response_ids_list)} responses; pass one response per prompt"
        )
    width = max(len(p) + len(r) for p, r in zip(prompt_ids_list, response_ids_list))
    b = len(prompt_ids_list)
    input_ids_bt = torch.full((b, width), pad_id, dtype=torch.long)
    attention_mask_bt = torch.zeros((b, width), dtype=torch.long)
    response_mask_bt = torch.zeros((b, width), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompt_ids_list, response_ids_list)):
        n = len(p) + len(r)
        input_ids_bt[i, :n] = torch.tensor(p + r, dtype=torch.long)
        attention_mask_bt[i, :n] = 1
        response_mask_bt[i, len(p) : n] = 1.0
    return input_ids_bt, attention_mask_bt, response_mask_bt


def pad_response_values(
    prompt_lens: list[int], values_list: list[list[float]], width: int
) -> torch.Tensor:
    """Place per-response-token values (e.g. behaviour logprobs) into the ``pad_and_stack``
    layout: row i gets ``values_list[i]`` at columns ``prompt_lens[i]:``, zeros elsewhere."""
    out_bt = torch.zeros((len(values_list), width), dtype=torch.float32)
    for i, (start, vals) in enumerate(zip(prompt_lens, values_list)):
        if start + len(vals) > width:
            raise ValueError(
                f"row {i}: prompt length {start} + {len(vals)} values exceeds width {width}"
            )
        out_bt[i, start : start + len(vals)] = torch.tensor(vals, dtype=torch.float32)
    return out_bt
