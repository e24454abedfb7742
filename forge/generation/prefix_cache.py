"""KV caches of finished sequences, kept for reuse by the next turn of the same conversation.

A multi-turn episode (``forge.envs.run_episode``) sends the whole conversation every turn:
turn t+1's prompt is turn t's prompt, the tokens sampled in turn t and a few template and
environment tokens. When a row finishes, ``HFEngine`` stores here the KV of every token it fed
the model (the prompt and all sampled tokens but the last, which was sampled and never fed),
keyed by those token ids. A later prompt that starts with a stored key reuses its KV and
prefills only the rest.

- Exact token-id prefix match; the longest key wins. A used entry is dropped: the longer
  conversation that reused it supersedes it (and is stored in turn when it finishes).
- LRU bounded by the total number of cached tokens (``max_tokens``); an entry longer than the
  whole budget is not kept. ``max_tokens == 0`` disables the cache.
- Tied to one weight ``version``: ``reset(version)`` empties it. KV computed with other
  weights must never be reused, so the engine resets it whenever its weights change.

Each entry holds, per layer, keys and values of shape ``[H, T, D]`` (copies, so an entry does
not keep a whole batch's cache alive).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each [H, T, D]


@dataclass
class PrefixHit:
    """A stored sequence that a prompt starts with: its ids and its KV."""

    key: tuple[int, ...]
    kv: LayerKV


class PrefixCache:
    """An LRU of ``token ids -> KV`` for one weight version. See the module docstring."""

    def __init__(self, max_tokens: int, version: int = 0) -> None:
        if max_tokens < 0:
            raise ValueError(f"prefix cache max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.version = version
        self.tokens = 0  # cached tokens, summed over entries
        self.evictions = 0
        self._entries: OrderedDict[tuple[int, ...], LayerKV] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_tokens > 0

    def __len__(self) -> int:
        return len(self._entries)

    def fits(self, n_tokens: int) -> bool:
        """Whether a sequence of ``n_tokens`` would be kept (checked before copying its KV)."""
        return 0 < n_tokens <= self.max_tokens

    def lookup(self, ids: tuple[int, ...]) -> PrefixHit | None:
        """The entry with the longest key that ``ids`` starts with (a key may equal ``ids``)."""
        best: tuple[int, ...] | None = None
        n = len(ids)
        for key in self._entries:
            k = len(key)
            if k > n or (best is not None and k <= len(best)):
                continue
            # Cheap rejections first: most keys differ in their last token.
            if key[-1] == ids[k - 1] and key[0] == ids[0] and ids[:k] == key:
                best = key
        return None if best is None else PrefixHit(best, self._entries[best])

    def store(self, key: tuple[int, ...], kv: LayerKV) -> None:
        """Keep ``kv`` under ``key`` as the most recent entry; evict LRU entries to fit."""
        if not self.fits(len(key)):
            return
        self.discard(key)
        self._entries[key] = kv
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self.tokens -= len(old)
            self.evictions += 1

    def tensors(self):
        """Every kept key/value tensor (for memory accounting)."""
        for kv in self._entries.values():
            for k, v in kv:
                yield k
                yield v

    def discard(self, key: tuple[int, ...]) -> None:
        if self._entries.pop(key, None) is not None:
            self.tokens -= len(key)

    def reset(self, version: int) -> None:
        """Drop every entry; from now on entries belong to weight version ``version``."""
        self._entries.clear()
        self.tokens = 0
        self.version = version
