"""Batched generation on a plain transformers causal LM, with a KV cache and continuous batching.

The Generator actor wraps this; it is plain PyTorch so it is testable in-process::

    engine = HFEngine(model, tokenizer, max_batch_size=32, version=0)
    [[c1, c2]] = engine.generate([("Q: 1+1=", SamplingParams(n=2, max_tokens=8))])

    # or step-wise (continuous batching): requests join between decode steps
    rid = engine.add_request(messages, SamplingParams(seed=3))
    while engine.has_work():
        for rid, completions in engine.step(): ...

How a step works: waiting rows are admitted while fewer than ``max_batch_size`` are running;
they are left-padded, prefilled together and their KV cache is appended to the running one.
Then every running row samples one token (``sampling.sample_next``) and finished rows are
dropped from the batch and its cache, so they stop costing compute (lazily: once they are a
quarter of the batch, or rows wait to be admitted, since each drop copies the cache).

Rows with the same prompt (a request's ``n`` samples: a GRPO group) are prefilled once and
share copies of that KV (``prefill_shared_rows`` counts the rows that skipped a prefill).

Prefix reuse (``prefix_cache_tokens > 0``; ``prefix_cache.py``): a finished row's KV is kept,
keyed by the token ids it covers. An admitted row whose prompt starts with a kept sequence
(a conversation's next turn) is prefilled on top of that KV: admitted hit rows form one group
whose cached KVs are stacked left-padded to a common past length, and each row feeds the
``S`` last tokens of its prompt, ``S`` being the longest new suffix in the group (a row with a
shorter suffix recomputes a few cached positions, so every row's tokens stay contiguous and
the batch keeps its one layout: left padding, then tokens). Misses are prefilled as before,
in their own group. Entries belong to one weight version: setting ``version`` (done after
every weight change) empties the cache, and only rows admitted on the cache's version store
or reuse KV. Results equal those without reuse (same tokens for a seed; logprobs within
float rounding).

Conventions (see ``forge.types.Completion``):
- ``token_ids`` include a generated EOS token (so the trainer learns to stop); ``text`` is
  decoded without special tokens.
- Stop strings: ``token_ids``/``logprobs`` keep every token up to and including the one that
  completed the stop string; ``text`` is cut just before the stop string.
- ``logprobs[i]`` is log softmax(logits / temperature)[token] before top-k/top-p filtering
  (temperature 0 reports temperature 1), so ``forge.models.token_logprobs`` recomputes it.
- ``generator_version`` is ``self.version`` when the request was added, so a weight update
  that bumps ``version`` mid-flight cannot relabel requests already running.
- Each sample has its own seed, from ``(seed, sample index)`` when ``SamplingParams.seed`` is
  set; its i-th token is drawn with ``counter_uniform(row seed, i)`` (counter-based, no RNG
  state), so results do not depend on batch neighbours and a batch samples in one pass.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter, deque
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from forge.generation import attention, kv_cache, packed_weights
from forge.generation.prefix_cache import PrefixCache, PrefixHit
from forge.generation.prompts import Prompt, encode_prompt
from forge.generation.sampling import counter_uniform, sample_next
from forge.models import cpu_head
from forge.models.logprobs import position_ids_from_mask
from forge.models.shared_prefix import MIN_COMMON_SAVING, common_length
from forge.observability.memory import tensor_bytes
from forge.types import Completion, SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, sample) pairs apart
logger = logging.getLogger("forge.generator")


@dataclass
class _Row:
    """One sample being generated."""

    request_id: int
    sample_idx: int
    prompt: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int  # the row's draws: counter_uniform(seed, token index)
    version: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    stop_reason: str | None = None
    slot: int = 0  # the LoRA slot (lora_mode multi; 0: the base model)
    adapter: str | None = None


@dataclass
class _Running:
    """The decode batch: rows aligned with the tensors' batch dimension."""

    rows: list[_Row]
    cache: DynamicCache
    attention_mask_bt: torch.Tensor
    next_pos_b: torch.Tensor  # position id the next fed token gets
    logits_bv: torch.Tensor  # next-token logits, fp32


class HFEngine:
    """Generation core over an HF ``model`` (eval mode) and its ``tokenizer``.

    Not thread-safe: one caller drives ``generate``/``add_request``/``step``. Bump
    ``version`` after loading new weights (that also empties the prefix cache); ``seed`` fixes
    the streams of unseeded requests. ``prefix_cache_tokens`` bounds the KV kept for prefix
    reuse (0: off). ``counters`` (optional, shared by a backend's engines) receives
    ``prefix_hits``, ``prefix_misses``, ``prefix_reused_tokens`` and ``prefill_tokens``.
    """

    def __init__(
        self,
        model,
        tokenizer,
        max_batch_size: int = 32,
        version: int = 0,
        seed: int = 0,
        prefix_cache_tokens: int = 0,
        counters: Counter | None = None,
        lora=None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        self.lora = lora  # forge.generation.multi_lora.LoraSlots: per-row adapters
        if lora is not None and prefix_cache_tokens:
            raise ValueError(
                "prefix reuse does not combine with per-row adapters (lora_mode multi)"
            )
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self._prefix = PrefixCache(prefix_cache_tokens, version)
        self._version = version
        self.counters = Counter() if counters is None else counters
        self.device = next(model.parameters()).device
        # Decode steps attend without repeating grouped KV heads (attention.py).
        self._fast_attention = attention.use_fast_decode(model)
        self._sliding = attention.has_sliding_window(model)
        # A float32 CPU head through oneDNN (forge/models/cpu_head.py): ~2x MKL's at decode.
        cpu_head.use_onednn_head(model)
        # Long decodes: the body's float32 CPU weights laid out once per version for oneDNN.
        self._packer = packed_weights.DecodePacker(model)
        self.pad_id = tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = tokenizer.eos_token_id
        self.eos_ids = _eos_ids(model, tokenizer)
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        # Seeds for requests without one: reproducible per engine, no global RNG state.
        self._seed_rng = torch.Generator().manual_seed(seed)
        self._ids = itertools.count()
        self._waiting: deque[_Row] = deque()
        self._running: _Running | None = None
        self._pending: dict[int, list[_Row | None]] = {}

    @property
    def version(self) -> int:
        """The weight version new requests are stamped with."""
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        if value != self._version:
            self._prefix.reset(value)  # KV computed with the old weights must not be reused
            self._packer.clear()  # nor layouts of the old weights
        self._version = value

    def clear_prefix_cache(self) -> None:
        """Drop all kept KV and weight layouts (call before changing the weights in place)."""
        self._prefix.reset(self._version)
        self._packer.clear()

    def kv_cache_bytes(self) -> int:
        """Bytes of KV held now: the running batch's cache (with its spare positions) and
        the kept prefixes."""
        tensors = list(self._prefix.tensors())
        if self._running is not None:
            for layer in self._running.cache.layers:
                tensors += [
                    layer.keys,
                    layer.values,
                    getattr(layer, "_buf_k", None),
                    getattr(layer, "_buf_v", None),
                ]
        return tensor_bytes(tensors)

    def prefix_cache_stats(self) -> dict[str, int]:
        """Entries and tokens kept now, and LRU evictions so far."""
        p = self._prefix
        return {"entries": len(p), "tokens": p.tokens, "evictions": p.evictions}

    # ---- public API -------------------------------------------------------------------

    def generate(self, requests: list[tuple[Prompt, SamplingParams]]) -> list[list[Completion]]:
        """Generate ``params.n`` completions for each ``(prompt, params)``, in request order.

        Needs an idle engine (requests added with ``add_request`` would be drained and their
        results dropped). All prompts are validated before any is queued.
        """
        if self.has_work():
            raise RuntimeError(
                "generate() called while step()-API requests are in flight; "
                "drain them with step() first"
            )
        encoded = [(*self._encode_prompt(prompt), params) for prompt, params in requests]
        ids = [self._enqueue(text, prompt_ids, params) for text, prompt_ids, params in encoded]
        done: dict[int, list[Completion]] = {}
        while self.has_work():
            done.update(self.step())
        return [done.pop(i) for i in ids]

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        slot: int = 0,
        version: int | None = None,
        adapter: str | None = None,
    ) -> int:
        """Queue a request (string, chat messages or token ids); returns its id for ``step()``.
        ``slot``: its LoRA slot (``lora`` engines), whose ``version`` and ``adapter`` name
        its completions carry."""
        request_id = self._enqueue(*self._encode_prompt(prompt), params)
        if slot or adapter is not None:
            if self.lora is None:
                raise ValueError("this engine serves no adapters (lora_mode is not multi)")
            for row in self._waiting:
                if row.request_id == request_id:
                    row.slot, row.adapter = slot, adapter
                    row.version = self.version if version is None else version
        return request_id

    def slots_in_use(self) -> set[int]:
        """The LoRA slots of waiting and running rows."""
        rows = list(self._waiting) + ([] if self._running is None else self._running.rows)
        return {r.slot for r in rows}

    def _select_slots(self, rows: list[_Row]) -> None:
        if self.lora is not None:
            self.lora.set_rows([r.slot for r in rows])

    def has_work(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self._waiting) or self._running is not None

    @torch.inference_mode()
    def step(self) -> list[tuple[int, list[Completion]]]:
        """Admit waiting rows, sample one token per running row; return finished requests."""
        self._admit()
        if self._running is None:
            return []
        finished = self._decode_step()
        out = []
        for row in finished:
            slots = self._pending[row.request_id]
            slots[row.sample_idx] = row
            if all(r is not None for r in slots):
                del self._pending[row.request_id]
                out.append((row.request_id, [self._to_completion(r) for r in slots]))
        return out

    # ---- prefill / decode ---------------------------------------------------------------

    def _admit(self) -> None:
        run = self._running
        if run is not None and self._waiting:  # finished rows riding along make room first
            live = [i for i, r in enumerate(run.rows) if r.stop_reason is None]
            if len(live) < len(run.rows):
                self._running = run = _select(run, live)
        running = 0 if run is None else len(run.rows)
        free = self.max_batch_size - running
        if free <= 0 or not self._waiting:
            return
        rows = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        hits = [self._lookup(r) for r in rows]
        for key in {h.key for h in hits if h is not None}:
            self._prefix.discard(key)  # superseded by the longer conversation (n > 1 shares it)
        new = None
        for is_hit in (True, False):
            group = [(r, h) for r, h in zip(rows, hits) if (h is not None) == is_hit]
            if group:
                part = self._prefill([r for r, _ in group], [h for _, h in group])
                new = part if new is None else _merge(new, part)
        assert new is not None
        self._running = new if self._running is None else _merge(self._running, new)

    def _lookup(self, row: _Row) -> PrefixHit | None:
        """The kept KV that ``row``'s prompt starts with, if any (same weight version only)."""
        if not self._prefix.enabled or row.version != self._prefix.version:
            return None
        hit = self._prefix.lookup(tuple(row.prompt_ids))
        self.counters["prefix_hits" if hit else "prefix_misses"] += 1
        return hit

    def _prefill(self, rows: list[_Row], hits: list[PrefixHit | None]) -> _Running:
        """Prefill ``rows`` together, on top of their ``hits``' KV where given.

        Every row feeds its last ``width`` prompt tokens (all of them when shorter), ``width``
        being the longest suffix not covered by a hit; a prompt always feeds >= 1 token, whose
        logits give the first sample. Row i reuses ``reuse[i]`` cached positions, stacked
        left-padded to ``past`` columns, so its tokens end up contiguous and right-aligned.
        """
        from_cache = any(h is not None for h in hits)
        if not from_cache:
            shared = self._prefill_shared(rows)
            if shared is not None:
                return shared
            hits = self._common_start(rows) or hits
        lengths = [len(r.prompt_ids) for r in rows]
        cached = [0 if h is None else min(len(h.key), n - 1) for h, n in zip(hits, lengths)]
        width = max(n - c for n, c in zip(lengths, cached))
        reuse = [max(0, n - width) for n in lengths]  # <= cached[i], by the choice of width
        past = max(reuse)
        input_ids_bt = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask_bt = torch.zeros((len(rows), past + width), dtype=torch.long)
        for i, (r, n, k) in enumerate(zip(rows, lengths, reuse)):
            # left padding: every row's last token is at column -1
            input_ids_bt[i, width - (n - k) :] = torch.tensor(r.prompt_ids[k:])
            attention_mask_bt[i, past + width - n :] = 1
        input_ids_bt = input_ids_bt.to(self.device)
        attention_mask_bt = attention_mask_bt.to(self.device)
        if past:
            cache = kv_cache.stack_left_padded([h.kv if h else None for h in hits], reuse)
        else:
            cache = kv_cache.growing_cache()
        self.counters["prefix_reused_tokens" if from_cache else "prefill_common_tokens"] += sum(
            reuse
        )
        self.counters["prefill_tokens"] += sum(lengths) - sum(reuse)
        self._select_slots(rows)
        out = self.model(
            input_ids=input_ids_bt,
            attention_mask=attention_mask_bt,
            position_ids=position_ids_from_mask(attention_mask_bt)[:, past:],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        next_pos_b = attention_mask_bt.sum(-1)
        return _Running(
            rows, out.past_key_values, attention_mask_bt, next_pos_b, out.logits[:, -1].float()
        )

    def _common_start(self, rows: list[_Row]) -> list[PrefixHit] | None:
        """When the rows' prompts start with the same tokens (a system prompt, the chat
        template's header), their KV computed once on one row, as a hit for every row;
        ``None`` when that would save fewer than ``MIN_COMMON_SAVING`` positions."""
        n = common_length([r.prompt_ids for r in rows]) if len(rows) > 1 else 0
        if self.lora is not None or (len(rows) - 1) * n < MIN_COMMON_SAVING:
            return None
        ids = torch.tensor([rows[0].prompt_ids[:n]], device=self.device)
        out = self.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(n, device=self.device)[None],
            past_key_values=kv_cache.growing_cache(),
            use_cache=True,
            logits_to_keep=1,
        )
        if not kv_cache.is_full_attention(out.past_key_values):
            return None
        self.counters["prefill_tokens"] += n
        return [
            PrefixHit(tuple(ids[0].tolist()), kv_cache.row_kv(out.past_key_values, 0, n))
        ] * len(rows)

    def _prefill_shared(self, rows: list[_Row]) -> _Running | None:
        """Prefill each distinct prompt once and give its rows copies of the KV and first
        logits (a request's ``n`` samples, a GRPO group, share one prompt); ``None`` when
        every prompt is distinct."""
        index: dict[tuple[int, ...], int] = {}
        src = [index.setdefault((r.slot, *r.prompt_ids), len(index)) for r in rows]
        if len(index) == len(rows):
            return None
        firsts = [-1] * len(index)  # the first row of each distinct prompt
        for i, k in enumerate(src):
            if firsts[k] < 0:
                firsts[k] = i
        run = self._prefill([rows[i] for i in firsts], [None] * len(firsts))
        self.counters["prefill_shared_rows"] += len(rows) - len(firsts)
        src_b = torch.tensor(src, device=run.attention_mask_bt.device)
        return _Running(
            rows,
            kv_cache.select_rows(run.cache, src_b),
            run.attention_mask_bt[src_b],
            run.next_pos_b[src_b],
            run.logits_bv[src_b],
        )

    def _keep_prefixes(self, run: _Running, finished: list[int]) -> None:
        """Store the KV of finished rows: everything fed, i.e. all but the last sampled token."""
        if not kv_cache.is_full_attention(run.cache):
            logger.warning("prefix reuse needs full-attention KV caches; turned off")
            self._prefix.max_tokens = 0
            return
        fed_b = run.attention_mask_bt[finished].sum(-1).tolist()
        for i, fed in zip(finished, fed_b):
            row = run.rows[i]
            key = (*row.prompt_ids, *row.token_ids[:-1])
            assert fed == len(key), f"row covers {fed} positions, expected {len(key)}"
            if row.version == self._prefix.version and self._prefix.fits(fed):
                self._prefix.store(key, kv_cache.row_kv(run.cache, i, fed))

    def _decode_step(self) -> list[_Row]:
        """Sample for every running row, drop finished rows, run the model on the rest."""
        run = self._running
        assert run is not None
        uniforms_b = torch.tensor(
            [counter_uniform(r.seed, len(r.token_ids)) for r in run.rows], dtype=torch.float64
        )
        token_ids_b, logprobs_b = sample_next(
            run.logits_bv, [r.params for r in run.rows], uniforms_b
        )
        finished, keep = [], []
        for i, (row, tok, lp) in enumerate(
            zip(run.rows, token_ids_b.tolist(), logprobs_b.tolist())
        ):
            if row.stop_reason is not None:  # finished earlier; left in until compaction
                continue
            row.token_ids.append(tok)
            row.logprobs.append(lp)
            self._check_stop(row)
            (finished if row.stop_reason else keep).append(i)
        done = [run.rows[i] for i in finished]
        if finished and self._prefix.enabled:
            self._keep_prefixes(run, finished)
        if not keep:
            self._running = None
            return done
        # the most tokens a running row may still decode: whether weight layouts pay
        left = max(run.rows[i].params.max_tokens - len(run.rows[i].token_ids) for i in keep)
        # Finished rows leave the batch (a copy of its cache) once they are a quarter of it or
        # new rows wait for room; until then they ride along and their outputs are ignored.
        dead = len(run.rows) - len(keep)
        if dead and (4 * dead >= len(run.rows) or self._waiting):
            run = _select(run, keep)
            token_ids_b = token_ids_b[keep]
        run.attention_mask_bt = torch.cat(
            [run.attention_mask_bt, run.attention_mask_bt.new_ones(len(run.rows), 1)], dim=1
        )
        mask = run.attention_mask_bt
        if self._fast_attention and not self._sliding:
            # the 4D decode mask, so the model does not build one per step (a model with
            # sliding-window layers builds its own: the window is a mask of its own)
            mask = attention.decode_mask(mask, self._fast_attention, self.model.dtype)
        self._select_slots(run.rows)
        with self._packer.active(left):
            out = self.model(
                input_ids=token_ids_b.unsqueeze(1),
                attention_mask=mask,
                position_ids=run.next_pos_b.unsqueeze(1),
                past_key_values=run.cache,
                use_cache=True,
            )
        run.cache, run.logits_bv = out.past_key_values, out.logits[:, -1].float()
        run.next_pos_b = run.next_pos_b + 1
        self._running = run
        return done

    # ---- helpers ----------------------------------------------------------------------

    def _check_stop(self, row: _Row) -> None:
        """Set ``row.stop_reason`` (and the final text) if the row is done. The text is decoded
        every step only when the row has stop strings to look for; otherwise once, at the end."""
        if row.token_ids[-1] in self.eos_ids and not row.params.ignore_eos:
            row.stop_reason = "stop"
            row.text = self._decode(row.token_ids)
            return
        if any(row.params.stop):
            text = self._decode(row.token_ids)
            hits = [i for i in (text.find(s) for s in row.params.stop if s) if i >= 0]
            if hits:
                row.stop_reason, row.text = "stop", text[: min(hits)]
                return
            row.text = text
        at_context_end = (
            self.max_positions is not None
            and len(row.prompt_ids) + len(row.token_ids) >= self.max_positions
        )
        if len(row.token_ids) >= row.params.max_tokens or at_context_end:
            row.stop_reason = "length"
            if not any(row.params.stop):
                row.text = self._decode(row.token_ids)

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _encode_prompt(self, prompt: Prompt) -> tuple[str, list[int]]:
        return encode_prompt(self.tokenizer, prompt, self.max_positions)

    def _enqueue(self, text: str, prompt_ids: list[int], params: SamplingParams) -> int:
        request_id = next(self._ids)
        self._pending[request_id] = [None] * params.n
        for j in range(params.n):
            seed = self._row_seed(params, j)
            self._waiting.append(_Row(request_id, j, text, prompt_ids, params, seed, self.version))
        return request_id

    def _row_seed(self, params: SamplingParams, sample_idx: int) -> int:
        if params.seed is None:
            base = int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        else:
            base = params.seed
        return (base * _SEED_MIX + sample_idx) % 2**63

    @staticmethod
    def _to_completion(row: _Row) -> Completion:
        return Completion(
            prompt=row.prompt,
            prompt_ids=list(row.prompt_ids),
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            text=row.text,
            stop_reason=row.stop_reason or "length",
            generator_version=row.version,
            adapter=row.adapter,
        )


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(source)
    return ids


def _select(run: _Running, keep: list[int]) -> _Running:
    """Keep rows ``keep``; then drop leading columns that are now padding for every row."""
    keep_b = torch.tensor(keep, device=run.attention_mask_bt.device)
    mask_bt = run.attention_mask_bt[keep_b]
    lead = int(mask_bt.any(dim=0).long().argmax())  # first column some row attends to
    cache = kv_cache.drop_leading_columns(kv_cache.select_rows(run.cache, keep_b), lead)
    return _Running(
        [run.rows[i] for i in keep],
        cache,
        mask_bt[:, lead:],
        run.next_pos_b[keep_b],
        run.logits_bv[keep_b],
    )


def _merge(a: _Running, b: _Running) -> _Running:
    """Append the rows of a freshly prefilled batch ``b`` to the running batch ``a``."""
    t = max(a.attention_mask_bt.shape[1], b.attention_mask_bt.shape[1])

    def pad(mask_bt: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(mask_bt, (t - mask_bt.shape[1], 0))

    return _Running(
        a.rows + b.rows,
        kv_cache.concat_left_padded(a.cache, b.cache),
        torch.cat([pad(a.attention_mask_bt), pad(b.attention_mask_bt)]),
        torch.cat([a.next_pos_b, b.next_pos_b]),
        torch.cat([a.logits_bv, b.logits_bv]),
    )
