"""Two-rank DDP with LoRA matches one rank (three trainer processes)."""

from __future__ import annotations

import pytest
import torch

from forge.losses import LossConfig  # noqa: E402
from forge.training import OptimizerConfig, TrainerConfig  # noqa: E402
from forge.training.trainer_config import LoraConfig  # noqa: E402
from forge.weights import unpack_adapter  # noqa: E402


async def test_two_rank_ddp_lora_matches_one_rank(tiny_model):
    from forge.actors.trainer import Trainer
    from forge.replay import collate_episodes
    from forge.weights import pull_handle
    from tests.episodes import make_episodes

    opt = OptimizerConfig(lr=0.1, eps=1.0, max_grad_norm=None)  # compares like gradients
    eps0, eps1 = make_episodes(tiny_model, n=3), make_episodes(tiny_model, n=2, offset=3)
    cfg = TrainerConfig(
        model=tiny_model,
        optimizer=opt,
        lora=LoraConfig(rank=4),
        loss=LossConfig(type="grpo"),
        micro_batch_size=2,
    )
    single = await Trainer.as_actor(cfg)
    m_single = await single.train_step.call_one(collate_episodes(eps0 + eps1))
    _, want = unpack_adapter(pull_handle(await single.push_weights.call_one(1)))
    await single.close.call_one()
    await single.shutdown()
    dp = await Trainer.options(procs=2).as_actor(cfg)
    m0, _ = (await dp.train_step.call([collate_episodes(eps0), collate_episodes(eps1)])).values()
    assert m0["loss"] == pytest.approx(m_single["loss"], rel=1e-5)
    handle, other = (await dp.push_weights.call(1)).values()
    assert other is None
    _, got = unpack_adapter(pull_handle(handle))
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=2e-6, msg=k)
    await dp.close.call()
