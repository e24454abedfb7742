"""Two-rank DDP and FSDP trainers match one rank on the concatenated batch (three trainer
processes each)."""

from __future__ import annotations

from tests.integration.training.test_trainer_actor import _dp_vs_single


async def test_two_rank_ddp_matches_one_rank_on_the_concatenated_batch(tiny_model):
    await _dp_vs_single(tiny_model, "ddp")


async def test_two_rank_fsdp_matches_one_rank_on_the_concatenated_batch(tiny_model):
    await _dp_vs_single(tiny_model, "fsdp")
