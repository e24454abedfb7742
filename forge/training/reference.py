"""The frozen reference policy's logprobs, for the KL term of the loss.

``ReferenceCore(cfg).logprobs(batch)`` takes either

* a :class:`~forge.types.TrainBatch` and returns ``ref_logprobs_bt``, a ``[B, T]`` float32
  CPU tensor aligned with ``batch.input_ids_bt`` exactly like ``TrainBatch.ref_logprobs_bt``
  (position t holds log p(token_t | tokens_<t) on response tokens, 0 elsewhere), or
* a list of :class:`~forge.types.Episode` and returns one list of floats per episode, the
  logprobs of its ``response_ids`` only, ready to store in ``Episode.ref_logprobs`` (which
  ``collate_episodes`` turns back into the ``[B, T]`` layout).

The values are ``forge.models.token_logprobs`` at ``cfg.temperature`` under no grad in eval
mode: the same function the trainer differentiates, so at equal weights the trainer's
logprobs and these agree (the KL starts at 0).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from forge.models import load_model, token_logprobs
from forge.replay import collate_episodes
from forge.training.config import ReferenceConfig, resolve_device
from forge.types import Episode, TrainBatch

__all__ = ["ReferenceCore"]


class ReferenceCore:
    """A model in eval mode that only ever computes logprobs. See the module docstring."""

    def __init__(self, cfg: ReferenceConfig) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.model = load_model(cfg.model, cfg.dtype, self.device, cfg.attn_implementation)
        self.model.eval().requires_grad_(False)

    @torch.no_grad()
    def logprobs_bt(
        self, input_ids_bt: torch.Tensor, attention_mask_bt: torch.Tensor
    ) -> torch.Tensor:
        """``[B, T]`` logprobs of every attended token (prompt too) on CPU, computed
        ``micro_batch_size`` rows at a time."""
        rows = input_ids_bt.shape[0]
        per = self.cfg.micro_batch_size or rows
        pieces = []
        for start in range(0, rows, per):
            ids = input_ids_bt[start : start + per].to(self.device)
            mask = attention_mask_bt[start : start + per].to(self.device)
            pieces.append(token_logprobs(self.model, ids, mask, self.cfg.temperature).cpu())
        return torch.cat(pieces, dim=0)

    def logprobs(self, batch: TrainBatch | Sequence[Episode]) -> torch.Tensor | list[list[float]]:
        """``[B, T]`` for a ``TrainBatch``; per-episode response lists for episodes."""
        if isinstance(batch, TrainBatch):
            lp_bt = self.logprobs_bt(batch.input_ids_bt, batch.attention_mask_bt)
            # TrainBatch's layout holds 0 outside the response (prompt tokens included).
            return lp_bt * batch.response_mask_bt.to(lp_bt.dtype).cpu()
        episodes = list(batch)
        if not episodes or not all(isinstance(ep, Episode) for ep in episodes):
            raise TypeError(
                "ReferenceModel.forward takes a TrainBatch or a non-empty list of Episode, got "
                f"{type(batch).__name__}"
                + (f" of {type(episodes[0]).__name__}" if episodes else " (empty)")
            )
        collated = collate_episodes(episodes)
        lp_bt = self.logprobs_bt(collated.input_ids_bt, collated.attention_mask_bt)
        out = []
        for b, ep in enumerate(episodes):
            start = len(ep.prompt_ids)
            out.append(lp_bt[b, start : start + len(ep.response_ids)].tolist())
        return out
