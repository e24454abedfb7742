"""The Trainer actor in real processes: train, push/pull weights, checkpoints, DP, errors."""

from __future__ import annotations

import os

import pytest
import torch

from controller import ActorError
from forge.actors.trainer import Trainer
from forge.replay import collate_episodes
from forge.run.actors import actor_env_vars
from forge.training import OptimizerConfig, TrainerConfig
from forge.weights import pull_handle
from tests.episodes import make_batch, make_episodes


def _shm_files(prefix: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"forge-w-{prefix}-"))


def _assert_same_weights(a: dict, b: dict, exact: bool = True) -> None:
    assert list(a) == list(b)
    for name in a:
        if exact:
            assert torch.equal(a[name], b[name]), name
        else:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=2e-6, msg=name)


async def test_train_step_push_weights_and_bad_calls(tiny_model, tmp_path):
    prefix = f"t{os.getpid()}"
    cfg = TrainerConfig(model=tiny_model, optimizer=OptimizerConfig(lr=1e-3))
    cfg.weights.prefix, cfg.weights.keep_last = prefix, 2
    trainer = await Trainer.as_actor(cfg)
    batch = make_batch(tiny_model)
    metrics = await trainer.train_step.call_one(batch)
    for key in ("loss", "grad_norm", "lr", "tokens", "seconds", "policy_loss"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key
    assert metrics["tokens"] == float(batch.response_mask_bt.sum())
    # the list form: one batch per rank (one rank here)
    assert (await trainer.train_step.call_one([batch]))["step"] == 2.0

    handles = [await trainer.push_weights.call_one(v) for v in (1, 2, 3)]
    expected = await trainer.state_dict.call_one()
    pulled = pull_handle(handles[-1])
    _assert_same_weights(pulled, expected)
    assert "model.embed_tokens.weight" in pulled
    # keep_last=2; version 1's file is kept as a spare for the next push to rewrite.
    files = _shm_files(prefix)
    assert [n.split(f"-{prefix}-")[1][:2] for n in files[-2:]] == ["v2", "v3"]
    assert len(files) == 3 and files[0].startswith(f"forge-w-{prefix}-spare-")

    with pytest.raises(ActorError, match="list of 2 batches for a trainer of 1 ranks"):
        await trainer.train_step.call_one([batch, batch])
    with pytest.raises(ActorError, match="takes a TrainBatch"):
        await trainer.train_step.call_one({"input_ids_bt": batch.input_ids_bt})
    with pytest.raises(ActorError, match="not a complete trainer checkpoint"):
        await trainer.load.call_one(str(tmp_path))
    await trainer.close.call_one()
    assert _shm_files(prefix) == []


async def test_save_train_load_train_is_bitwise_identical(tiny_model, tmp_path):
    cfg = TrainerConfig(
        model=tiny_model,
        optimizer=OptimizerConfig(lr=1e-3),
        schedule={"warmup_steps": 3},
        weights={"type": "safetensors_dir", "root": str(tmp_path / "weights")},
    )
    # One fixed thread: under the thread budget a step's thread count follows the host's
    # load, and sums over 1 or 2 threads differ in the last bit (a CI run saw it).
    trainer = await Trainer.options(env_vars=actor_env_vars(1)).as_actor(cfg)
    b1, b2, b3 = (make_batch(tiny_model, n=3, offset=k) for k in range(3))
    await trainer.train_step.call_one(b1)
    await trainer.save.call_one(str(tmp_path / "ckpt"))
    first = [await trainer.train_step.call_one(b) for b in (b2, b3)]
    after_first = await trainer.state_dict.call_one()
    assert await trainer.load.call_one(str(tmp_path / "ckpt")) == 1
    second = [await trainer.train_step.call_one(b) for b in (b2, b3)]
    _assert_same_weights(await trainer.state_dict.call_one(), after_first)
    for m1, m2 in zip(first, second):
        assert {k: v for k, v in m1.items() if k != "seconds"} == {
            k: v for k, v in m2.items() if k != "seconds"
        }
    assert (tmp_path / "ckpt" / "config.json").exists()  # the weights load as an HF model
    # the shared-filesystem transport
    handle = await trainer.push_weights.call_one(7)
    assert handle.transport == "safetensors_dir" and handle.version == 7
    _assert_same_weights(pull_handle(handle), after_first)


async def test_missing_model_and_unknown_config_key_are_clear_errors(tiny_model, tmp_path):
    with pytest.raises(ActorError, match="make-tiny-model"):
        await Trainer.as_actor(TrainerConfig(model=str(tmp_path / "nope")))
    with pytest.raises(ActorError, match="optimizer.learning_rate: unknown key"):
        await Trainer.as_actor({"model": tiny_model, "optimizer": {"learning_rate": 1.0}})


# AdamW's first update is lr * g / (|g| + eps): with the default eps it is ~lr * sign(g), so
# gradients that differ by rounding in their last bits could flip tiny parameters' updates.
# eps=1 makes the update ~lr * g, so parameters compare like gradients do.
_DP_OPT = OptimizerConfig(lr=0.1, eps=1.0, max_grad_norm=None)


async def _dp_vs_single(tiny_model, parallelism: str) -> None:
    eps0 = make_episodes(tiny_model, n=3)
    eps1 = make_episodes(tiny_model, n=2, offset=3)  # a different row and token count
    single = await Trainer.as_actor(TrainerConfig(model=tiny_model, optimizer=_DP_OPT))
    m_single = await single.train_step.call_one(collate_episodes(eps0 + eps1))
    want = await single.state_dict.call_one()
    await single.shutdown()

    cfg = TrainerConfig(
        model=tiny_model, optimizer=_DP_OPT, parallelism=parallelism, micro_batch_size=2
    )
    dp = await Trainer.options(procs=2).as_actor(cfg)
    metrics = await dp.train_step.call([collate_episodes(eps0), collate_episodes(eps1)])
    m0, m1 = metrics.values()
    assert m0 == m1 or {k for k in m0 if m0[k] != m1[k]} == {"seconds"}
    assert m0["loss"] == pytest.approx(m_single["loss"], rel=1e-5)
    assert m0["tokens"] == m_single["tokens"]
    assert m0["grad_norm"] == pytest.approx(m_single["grad_norm"], rel=1e-4)
    handle, other = (await dp.push_weights.call(1)).values()
    assert other is None  # only rank 0 pushes
    _assert_same_weights(pull_handle(handle), want, exact=False)
    await dp.close.call()
