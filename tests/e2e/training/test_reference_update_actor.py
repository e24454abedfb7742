"""A moving reference in real processes: the Trainer pushes, EMA and reset ReferenceModels pull and
apply (10-18 s; the in-process update rules are
tests/integration/training/test_reference_update_actor.py)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from controller import ActorError
from forge.actors.reference_model import ReferenceModel
from forge.actors.trainer import Trainer
from forge.losses import LossConfig
from forge.training import OptimizerConfig, ReferenceConfig, ReferenceCore, TrainerConfig
from tests.episodes import make_batch
from tests.integration.training.test_reference_update_actor import _response


async def test_ema_and_reset_references_follow_the_pushed_policy(tiny_model):
    prefix = f"refupd{os.getpid()}"
    cfg = TrainerConfig(model=tiny_model, optimizer=OptimizerConfig(lr=1e-2))
    cfg.weights.prefix = prefix
    ema_cfg = ReferenceConfig(model=tiny_model, update={"type": "ema", "decay": 0.5})
    # The reset reference looks version 1 up by number through the trainer's shm prefix.
    reset_cfg = ReferenceConfig(
        model=tiny_model, update={"type": "reset"}, weights={"prefix": prefix}
    )
    trainer, ema_ref, reset_ref = await asyncio.gather(
        Trainer.as_actor(cfg), ReferenceModel.as_actor(ema_cfg), ReferenceModel.as_actor(reset_cfg)
    )
    batch = make_batch(tiny_model)
    initial = await trainer.state_dict.call_one()
    metrics = await trainer.train_step.call_one(batch)
    assert "clip_fraction" in metrics  # grpo
    handle = await trainer.push_weights.call_one(1)
    policy = await trainer.state_dict.call_one()

    assert await ema_ref.update_weights.call_one(1, handle) == 1
    assert await reset_ref.update_weights.call_one(1) == 1
    assert await ema_ref.version.call_one() == 1

    # By hand: a reference whose weights are 0.5 * initial + 0.5 * policy.
    by_hand = ReferenceCore(ReferenceConfig(model=tiny_model))
    before = by_hand.logprobs(batch)
    by_hand.model.load_state_dict({n: 0.5 * initial[n] + 0.5 * policy[n] for n in initial})
    expected = by_hand.logprobs(batch)
    assert (_response(expected - before, batch).abs().max()) > 1e-3  # the step moved it
    torch.testing.assert_close(await ema_ref.forward.call_one(batch), expected, rtol=0, atol=1e-5)

    trainer_lp = await trainer.logprobs.call_one(batch)
    reset_lp = await reset_ref.forward.call_one(batch)
    torch.testing.assert_close(
        _response(reset_lp, batch), _response(trainer_lp, batch), rtol=0, atol=1e-5
    )

    # The same version again is a no-op; an older one is an error.
    assert await ema_ref.update_weights.call_one(1, handle) == 1
    torch.testing.assert_close(await ema_ref.forward.call_one(batch), expected, rtol=0, atol=0)
    with pytest.raises(ActorError, match="version 0 is older than the version the reference"):
        await ema_ref.update_weights.call_one(0)

    # A schedule phase switches the trainer's loss from grpo to reinforce; the step goes on.
    await trainer.set_loss.call_one(LossConfig(type="reinforce"))
    metrics = await trainer.train_step.call_one(batch)
    assert "logprob_mean" in metrics and "clip_fraction" not in metrics
    assert metrics["step"] == 2.0
    await trainer.close.call_one()
