"""A policy loss that fails on purpose once a marker file exists (and removes it), for the
failure tests of colocated runs: the trainer's step raises while the generator sleeps."""

from __future__ import annotations

import os

from forge.losses import grpo_loss


def fail_when_marked(
    *,
    logprobs_bt,
    generator_logprobs_bt,
    advantages_b,
    mask_bt,
    old_logprobs_bt=None,
    marker: str,
    **_,
):
    """GRPO's loss, except that a call that finds ``marker`` removes it and raises."""
    if os.path.exists(marker):
        os.remove(marker)
        raise RuntimeError("injected trainer failure (tests/e2e/apps/flaky_loss.py)")
    return grpo_loss(
        logprobs_bt, generator_logprobs_bt, advantages_b, mask_bt, old_logprobs_bt=old_logprobs_bt
    )
