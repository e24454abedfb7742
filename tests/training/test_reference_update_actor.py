"""A moving reference in real processes: the Trainer pushes, ReferenceModels pull and apply."""

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
from forge.weights import WeightStore, WeightTransportConfig, build_transport, run_weights_prefix
from tests.training.conftest import make_batch


def _response(lp_bt: torch.Tensor, batch) -> torch.Tensor:
    return lp_bt[batch.response_mask_bt.bool()]


@pytest.mark.slow  # 10-18 s: slow tier, to keep the fast tier under 6 minutes
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


def test_core_update_rules_skips_and_errors_in_process(tiny_model, tmp_path):
    on_disk = WeightTransportConfig(type="safetensors_dir", root=str(tmp_path))
    store = WeightStore(build_transport(on_disk))
    initial = ReferenceCore(ReferenceConfig(model=tiny_model)).model.state_dict()
    policy = {n: t + 1.0 for n, t in initial.items()}
    handles = {v: store.push(policy, v) for v in (1, 2)}

    frozen = ReferenceCore(ReferenceConfig(model=tiny_model))
    assert frozen.update_weights(1, handles[1]) == 0 and frozen.update_weights() == 0  # "none"

    ref = ReferenceCore(
        ReferenceConfig(
            model=tiny_model,
            update={"type": "ema", "decay": 0.5, "every": 2},
            weights=on_disk,
        )
    )
    name = "model.norm.weight"
    assert ref.update_weights(1) == 0 and ref.seen_version == 1  # skipped: nothing pulled
    torch.testing.assert_close(ref.model.state_dict()[name], initial[name], rtol=0, atol=0)
    assert ref.update_weights() == 2  # the latest pushed, looked up through cfg.weights
    torch.testing.assert_close(ref.model.state_dict()[name], initial[name] + 0.5)
    with pytest.raises(ValueError, match="version=3 but a handle for version 1"):
        ref.update_weights(3, handles[1])
    with pytest.raises(ValueError, match="versions only move forward"):
        ref.update_weights(1, handles[1])
    with pytest.raises(ValueError, match="'safetensors_dir' needs root"):
        ReferenceConfig(model=tiny_model, weights={"type": "safetensors_dir"})
    # No shm prefix: versions are looked up at the run's publication location.
    run_default = ReferenceCore(ReferenceConfig(model=tiny_model, update={"type": "reset"}))
    assert run_default._transport_or_raise().prefix == run_weights_prefix()
    store.close()
