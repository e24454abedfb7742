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

``update_weights(version, handle)`` moves the reference towards a pushed policy version by
``cfg.update`` (``forge.training.reference_update``: ``none``, ``ema`` or ``reset``). It pulls
like the generator does (a ``WeightHandle`` with ``forge.weights.pull_handle``, or a version
number looked up through ``cfg.weights``); versions only move forward, and a version the rule
skips is recorded without pulling anything. The reference's state lives in this process
only: a restarted replica starts again from the initial weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from forge.models import token_logprobs
from forge.models.cpu_head import use_onednn_head
from forge.models.precision import resolve_auto, resolve_device
from forge.replay import collate_episodes, join_rows, split_rows
from forge.training.reference_update import apply_update_, should_update
from forge.training.trainer_config import ReferenceConfig
from forge.types import Episode, TrainBatch
from forge.weights import WeightHandle, build_transport, pull_handle
from forge.weights.pull import latest_pushed_version, requested_version

__all__ = ["ReferenceCore"]


class ReferenceCore:
    """A model in eval mode that only ever computes logprobs. See the module docstring."""

    def __init__(self, cfg: ReferenceConfig) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        from forge.training.lora import load_base_model  # an adapter directory: merged

        # ``dtype: auto`` (a teacher's) is decided here, in this process, for its device
        dtype = resolve_auto("reference.dtype", cfg.dtype, self.device) or "float32"
        self.model = load_base_model(cfg.model, dtype, self.device, cfg.attn_implementation)
        use_onednn_head(self.model)  # the trainer's and generator's head kernel (cpu_head.py)
        self.model.eval().requires_grad_(False)
        self.applied_version = 0  # the policy version the weights last moved to (0: initial)
        self.seen_version = 0  # the newest version offered, applied or skipped by the rule
        self._transport = None

    def version(self) -> int:
        """The policy version the reference's weights last applied (0: the initial weights)."""
        return self.applied_version

    def update_weights(self, version: int | None = None, handle: WeightHandle | None = None) -> int:
        """Apply ``cfg.update`` for the pushed policy ``version`` (or ``handle.version``;
        neither: the latest under ``cfg.weights``); returns ``applied_version``.

        Offering the version already seen is a no-op, an older one a ``ValueError``. With
        ``update.type="none"`` nothing is pulled or checked, so apps may call it always.
        """
        rule = self.cfg.update
        if rule.type == "none":
            return self.applied_version
        version = requested_version(version, handle, self._latest_pushed)
        if version == self.seen_version:
            return self.applied_version
        if version < self.seen_version:
            raise ValueError(
                f"weight version {version} is older than the version the reference last saw "
                f"({self.seen_version}); versions only move forward"
            )
        self.seen_version = version
        if not should_update(rule, version):
            return self.applied_version
        if handle is not None:
            policy_sd = pull_handle(handle)
        else:
            policy_sd = self._transport_or_raise().pull(version)
        apply_update_(rule, self.model.state_dict(), policy_sd, version)
        self.applied_version = version
        return version

    def _transport_or_raise(self):
        if self._transport is None:
            self._transport = build_transport(self.cfg.weights)
        return self._transport

    def _latest_pushed(self) -> int:
        return latest_pushed_version(self._transport_or_raise())

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
        rows = [split_rows(ep) for ep in episodes]  # history windows: a row per turn
        flat = [r for rs in rows for r in rs]
        collated = collate_episodes(flat)
        lp_bt = self.logprobs_bt(collated.input_ids_bt, collated.attention_mask_bt)
        per_row = []
        for b, r in enumerate(flat):
            start = len(r.prompt_ids)
            per_row.append(lp_bt[b, start : start + len(r.response_ids)].tolist())
        out, b = [], 0
        for rs in rows:
            out.append(join_rows(rs, per_row[b : b + len(rs)]))
            b += len(rs)
        return out
