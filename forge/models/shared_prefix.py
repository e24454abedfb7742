"""Teacher-forced logprobs with shared prompts computed once (a GRPO group's G rows share one).

``token_logprobs`` runs every row's prompt through the model, so a group of G completions of
one prompt pays for that prompt G times, forward and backward. Here each distinct prefix (the
tokens before a row's first scored token) runs once; its KV is gathered to the rows that share
it (``index_select``: gradients from every row flow back into the one prefix computation), and
only the rows' tails (completion, and for multi-turn everything after the first sampled token)
run per row on top of it. Tokens that every prefix starts with (a system prompt, the chat
template's header: 27 of the 46 prompt tokens in the real-model main job) run once more
upstream, on one row whose KV all prefixes attend to. Rows that are the same tokens as an
earlier row (a group's identical completions, common once a policy converges) run once too:
their logprobs are gathered back to every copy, so each copy's gradient flows into the one
computation, as if it had run on its own. The result has ``token_logprobs``' layout and values
(up to float rounding): position t holds log softmax(logits_{t-1} / temperature)[token_t] for
scored tail positions, 0 elsewhere. On the CPU demo (38-token prompts, 6-token answers, groups
of 8) the trainer runs ~4x fewer token positions.

Rows must be right-padded with their real tokens first (``collate_episodes``' layout).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from forge.models.logprobs import _split_head, effective_temperature, head_logprobs

__all__ = ["MIN_COMMON_SAVING", "common_length", "shared_prefix_logprobs"]

# Run the prefixes' common start once when that saves at least this many token positions
# (one more pass through the body costs about as much as a few dozen positions on a CPU).
MIN_COMMON_SAVING = 32
REPEATS_ONCE = True  # identical rows computed once (False: every row runs; in-process A/B)


def common_length(prefixes) -> int:
    """Length of the tokens all ``prefixes`` (token-id sequences) start with, leaving each
    >= 1 token of its own (its last hidden state gives the next token's logits)."""
    n = min(len(p) for p in prefixes) - 1
    first = prefixes[0]
    for p in prefixes[1:]:
        k = 0
        while k < n and p[k] == first[k]:
            k += 1
        n = k
    return max(0, n)


def _plain_cache(cache) -> bool:
    """A full-attention ``DynamicCache``: its rows can be gathered and expanded."""
    return isinstance(cache, DynamicCache) and all(
        type(layer) is DynamicLayer for layer in cache.layers
    )


def _full_span(model) -> float:
    """How many columns a batch may span and still attend as under full attention: a model's
    sliding window (Gemma 3's local layers, Mistral), else unbounded. Within it the window
    hides nothing, so full-attention caches and their row gathers are exact; a wider batch
    takes ``token_logprobs``."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return float("inf")
    return float(window)


def shared_prefix_logprobs(
    model,
    input_ids_bt: torch.Tensor,
    attention_mask_bt: torch.Tensor,
    scored_bt: torch.Tensor,
    temperature: float = 1.0,
    min_saving: float = 0.25,
    stats: dict[str, float] | None = None,
) -> torch.Tensor | None:
    """Logprobs ``[B, T]`` like ``token_logprobs``, prefixes shared; ``None`` when sharing does
    not pay (fewer than ``min_saving`` of the token positions would be saved, or the model has
    no separable body and head, or its cache is not a plain full-attention KV, or the batch is
    wider than the model's sliding window).

    ``scored_bt`` marks the positions whose logprobs matter (the loss mask); a row's prefix is
    everything before its first scored position, and only positions from there on are returned
    (earlier ones hold 0). ``stats`` (when given) gets ``repeated_rows``: rows computed once
    for an identical earlier row."""
    split = _split_head(model)
    if split is None:
        return None
    body, head = split
    batch, width = input_ids_bt.shape
    if width > _full_span(model):
        return None  # a sliding window would see the prefixes' padding as distance
    lengths = attention_mask_bt.sum(-1).tolist()
    scored = scored_bt.bool()
    first = torch.where(scored.any(-1), scored.float().argmax(-1), attention_mask_bt.sum(-1))
    cut = first.clamp(min=1).tolist()  # prefix lengths (>= 1 token: position 0 is never scored)
    ids = input_ids_bt.tolist()
    index: dict[tuple[int, ...], int] = {}
    src = [index.setdefault(tuple(ids[b][: cut[b]]), len(index)) for b in range(batch)]
    shared_len = sum(len(k) for k in index)
    # Rows with the same prefix and the same tail tokens: the first of them runs for all.
    distinct: dict[tuple, int] = {}
    rows_u: list[int] = []  # distinct row u -> the row that runs for it
    u_b: list[int] = []  # row -> its distinct row
    for b in range(batch):
        key = (src[b], tuple(ids[b][cut[b] : lengths[b]]), None if REPEATS_ONCE else b)
        u = distinct.setdefault(key, len(rows_u))
        if u == len(rows_u):
            rows_u.append(b)
        u_b.append(u)
    runs = set(rows_u)
    repeated = sum(lengths[b] - cut[b] for b in range(batch) if b not in runs)
    if sum(lengths) == 0 or (sum(cut) - shared_len + repeated) < min_saving * sum(lengths):
        return None

    device = input_ids_bt.device
    prefixes = list(index)
    plen = [len(p) for p in prefixes]
    p_width = max(plen)
    p_ids = torch.zeros((len(prefixes), p_width), dtype=torch.long)
    p_mask = torch.zeros((len(prefixes), p_width), dtype=torch.long)
    for u, p in enumerate(prefixes):
        p_ids[u, : len(p)] = torch.tensor(p)
        p_mask[u, : len(p)] = 1
    p_ids, p_mask = p_ids.to(device), p_mask.to(device)
    # Tokens every prefix starts with (a system prompt, a chat template's header) run once more
    # upstream: on a [1, common] row whose KV every prefix then attends to.
    common = common_length(prefixes)
    past = None
    if (len(prefixes) - 1) * common >= MIN_COMMON_SAVING:
        c_out = body(
            input_ids=p_ids[:1, :common],
            attention_mask=p_mask[:1, :common],
            position_ids=torch.arange(common, device=device)[None],
            past_key_values=DynamicCache(),  # full-attention layers (see _full_span)
            use_cache=True,
        )
        if not _plain_cache(c_out.past_key_values):
            return None
        past = DynamicCache(
            [
                (
                    layer.keys.expand(len(prefixes), -1, -1, -1),
                    layer.values.expand(len(prefixes), -1, -1, -1),
                )
                for layer in c_out.past_key_values.layers
            ]
        )
    else:
        common = 0
    p_out = body(
        input_ids=p_ids[:, common:],
        attention_mask=p_mask,
        position_ids=torch.arange(common, p_width, device=device).expand(len(prefixes), -1),
        past_key_values=DynamicCache() if past is None else past,
        use_cache=True,
    )
    cache = p_out.past_key_values
    if not _plain_cache(cache):
        return None  # sliding windows etc.: gathering rows of the cache is not enough
    plen_u = torch.tensor(plen, device=device)
    last_hidden_bd = p_out.last_hidden_state[
        torch.arange(len(prefixes), device=device), plen_u - 1 - common
    ]

    # Tails: each distinct row's tokens from its cut on, right-padded.
    n_u = len(rows_u)
    tail_len = [max(0, lengths[b] - cut[b]) for b in rows_u]
    t_width = max(1, max(tail_len))
    t_ids = torch.zeros((n_u, t_width), dtype=torch.long)
    t_mask = torch.zeros((n_u, t_width), dtype=torch.long)
    for u, b in enumerate(rows_u):
        if tail_len[u]:
            t_ids[u, : tail_len[u]] = torch.tensor(ids[b][cut[b] : lengths[b]])
            t_mask[u, : tail_len[u]] = 1
    t_ids, t_mask = t_ids.to(device), t_mask.to(device)
    src_b = torch.tensor([src[b] for b in rows_u], device=device)  # each distinct row's prefix
    # index_select, not ``keys[src_b]``: its backward is an index_add, much faster on CPU than
    # the accumulating index_put that advanced indexing takes (one per layer's keys and values).
    expanded = DynamicCache(
        [
            (layer.keys.index_select(0, src_b), layer.values.index_select(0, src_b))
            for layer in cache.layers
        ]
    )
    t_out = body(
        input_ids=t_ids,
        attention_mask=torch.cat([p_mask[src_b], t_mask], dim=1),
        position_ids=plen_u[src_b, None] + torch.arange(t_width, device=device),
        past_key_values=expanded,
        use_cache=False,
    )
    # Tail token j is predicted from the hidden state before it: the prefix's last for j = 0.
    hidden_btd = torch.cat([last_hidden_bd[src_b, None], t_out.last_hidden_state[:, :-1]], dim=1)
    # The head (the step's largest float32 matmuls, and [N, vocab] logits) only on real tail
    # tokens: the tails' right padding is a quarter of the positions at the main job's shape.
    real_bt = t_mask.bool()
    temp = effective_temperature(temperature)
    lp_n = head_logprobs(head, hidden_btd[real_bt], t_ids[real_bt], temp)
    lp_tail = lp_n.new_zeros(n_u, t_width).index_put((real_bt,), lp_n)
    if n_u < batch:  # every row gets its distinct row's logprobs (index_select: see above)
        lp_tail = lp_tail.index_select(0, torch.tensor(u_b, device=device))
    if stats is not None:
        stats["repeated_rows"] = float(batch - n_u)
    # Scatter tails back to their positions (one spare column per tail slot, then cut off).
    pos_bt = torch.tensor(cut, device=device)[:, None] + torch.arange(t_width, device=device)
    lp_bt = lp_tail.new_zeros(batch, width + t_width).scatter(1, pos_bt, lp_tail)
    return lp_bt[:, :width]
