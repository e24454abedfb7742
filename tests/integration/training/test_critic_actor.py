"""The Critic actor in a real process: values, train_step, save/load, clear errors."""

from __future__ import annotations

import pytest
import torch

from controller import ActorError
from forge.actors.critic import Critic
from forge.losses.value import ppo_advantages_for_batch
from forge.training.value_model import CriticConfig
from tests.episodes import make_batch


async def test_values_train_step_save_load_round_trip(tiny_model, tmp_path):
    critic = await Critic.as_actor(
        CriticConfig(model=tiny_model, device="cpu", micro_batch_size=3, optimizer={"lr": 1e-2})
    )
    batch = make_batch(tiny_model)
    rewards_b = torch.tensor([1.0, 0.0, 1.0, 0.0])
    values_bt = await critic.values.call_one(batch)
    assert values_bt.shape == batch.input_ids_bt.shape and not values_bt.any()  # zero head

    _, returns_bt = ppo_advantages_for_batch(batch, rewards_b, values_bt)
    m = await critic.train_step.call_one(batch, returns_bt, values_bt)
    for key in ("value_loss", "value_clip_fraction", "explained_variance", "grad_norm", "lr"):
        assert key in m and torch.isfinite(torch.tensor(m[key])), key
    assert m["step"] == 1.0 and m["tokens"] == float(batch.response_mask_bt.sum())

    assert await critic.save.call_one(str(tmp_path / "ckpt")) == str(tmp_path / "ckpt")
    saved_bt = await critic.values.call_one(batch)
    assert saved_bt.any()
    await critic.train_step.call_one(batch, returns_bt)  # old values: the current ones
    assert not torch.equal(await critic.values.call_one(batch), saved_bt)
    assert await critic.load.call_one(str(tmp_path / "ckpt")) == 1
    assert torch.equal(await critic.values.call_one(batch), saved_bt)

    with pytest.raises(ActorError, match="returns_bt has shape"):
        await critic.train_step.call_one(batch, returns_bt[:, :2])
    with pytest.raises(ActorError, match="takes a TrainBatch"):
        await critic.values.call_one({"input_ids_bt": batch.input_ids_bt})


async def test_unknown_config_key_and_mesh_size_are_clear_errors(tiny_model):
    with pytest.raises(ActorError, match="optimizer.learning_rate: unknown key"):
        await Critic.as_actor({"model": tiny_model, "optimizer": {"learning_rate": 1.0}})
    with pytest.raises(ActorError, match="runs on one process"):
        await Critic.options(procs=2).as_actor(CriticConfig(model=tiny_model, device="cpu"))
