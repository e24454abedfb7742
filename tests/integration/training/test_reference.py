"""ReferenceModel: logprobs equal the trainer's at the same weights, in both layouts."""

from __future__ import annotations

import pytest
import torch

from controller import ActorError
from forge.actors.reference_model import ReferenceModel
from forge.losses import LossConfig
from forge.replay import collate_episodes
from forge.training import ReferenceConfig, ReferenceCore, TrainerConfig, TrainerCore
from forge.types import Episode
from tests.episodes import make_batch, make_episodes


def test_reference_logprobs_equal_the_trainers_at_the_same_weights(tiny_model):
    batch = make_batch(tiny_model, n=4)
    ref = ReferenceCore(ReferenceConfig(model=tiny_model, micro_batch_size=3))
    trainer = TrainerCore(TrainerConfig(model=tiny_model))
    ref_bt = ref.logprobs(batch)
    with torch.no_grad():
        train_bt = trainer.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    assert ref_bt.shape == batch.input_ids_bt.shape and ref_bt.dtype == torch.float32
    response = batch.response_mask_bt.bool()
    torch.testing.assert_close(ref_bt[response], train_bt[response], rtol=0, atol=1e-6)
    assert (ref_bt[response] < 0).all() and ref_bt[~response].eq(0).all()  # TrainBatch layout
    assert not any(p.requires_grad for p in ref.model.parameters()) and not ref.model.training


def test_episode_lists_match_the_padded_layout(tiny_model):
    episodes = make_episodes(tiny_model, n=3)
    ref = ReferenceCore(ReferenceConfig(model=tiny_model))
    per_episode = ref.logprobs(episodes)
    assert [len(lp) for lp in per_episode] == [len(ep.response_ids) for ep in episodes]
    for ep, lps in zip(episodes, per_episode):
        ep.ref_logprobs = lps
    batch = collate_episodes(episodes)
    torch.testing.assert_close(batch.ref_logprobs_bt, ref.logprobs(batch), rtol=0, atol=1e-6)
    with pytest.raises(TypeError, match="TrainBatch or a non-empty list of Episode"):
        ref.logprobs([])


def test_rows_of_a_windowed_episode_each_see_their_own_prompt(tiny_model):
    """An episode with row_starts (history windows): each row scored on its own, the values
    laid back on the episode's response; collating it gives the same numbers."""
    a, b = make_episodes(tiny_model, n=2)
    joined = Episode(
        "w",
        a.prompt_ids,
        a.response_ids + b.prompt_ids + b.response_ids,
        a.behavior_logprobs + [0.0] * len(b.prompt_ids) + b.behavior_logprobs,
        0.0,
        0,
        loss_mask=[1] * len(a.response_ids) + [0] * len(b.prompt_ids) + [1] * len(b.response_ids),
        row_starts=[len(a.response_ids)],
    )
    ref = ReferenceCore(ReferenceConfig(model=tiny_model))
    lp_a, lp_b = ref.logprobs([a, b])
    (lp_joined,) = ref.logprobs([joined])
    assert lp_joined == pytest.approx(lp_a + [0.0] * len(b.prompt_ids) + lp_b, abs=1e-6)
    joined.ref_logprobs = lp_joined
    batch = collate_episodes([joined])
    assert batch.input_ids_bt.shape[0] == 2
    torch.testing.assert_close(batch.ref_logprobs_bt, ref.logprobs(batch), rtol=0, atol=1e-6)


async def test_reference_actor_feeds_a_zero_kl_at_the_start(tiny_model):
    ref = await ReferenceModel.as_actor(ReferenceConfig(model=tiny_model))
    episodes = make_episodes(tiny_model, n=4)
    for ep, lps in zip(episodes, await ref.forward.call_one(episodes)):
        ep.ref_logprobs = lps
    batch = collate_episodes(episodes)
    as_tensor = await ref.forward.call_one(batch)
    torch.testing.assert_close(batch.ref_logprobs_bt, as_tensor, rtol=0, atol=1e-6)

    trainer = TrainerCore(TrainerConfig(model=tiny_model, loss=LossConfig(kl_coef=0.1)))
    first = trainer.train_step(batch)
    assert abs(first["kl_ref"]) < 1e-6  # same weights: no divergence yet
    second = trainer.train_step(batch)
    assert second["kl_ref"] > 1e-6  # after an update the policy has moved away

    with pytest.raises(ActorError, match="TrainBatch or a non-empty list of Episode"):
        await ref.forward.call_one("not a batch")
