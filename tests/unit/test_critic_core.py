"""CriticCore on a tiny model, in this process: zero init, alignment, fitting, accumulation."""

from __future__ import annotations

import pytest
import torch

from forge.losses.value import ppo_advantages_for_batch
from forge.models import make_tiny_model
from forge.replay import collate_episodes
from forge.training import OptimizerConfig
from forge.training.value_model import CriticConfig, CriticCore
from forge.types import Episode


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("critic") / "model", seed=0))


def _batch(n: int = 4):
    """Rows of different prompt and response lengths (right padding), rewards 1, 0, 1, 0."""
    g = torch.Generator().manual_seed(0)
    episodes = []
    for i in range(n):
        p, r = 3 + i, 2 + (2 * i) % 5
        ids = torch.randint(4, 200, (p + r,), generator=g).tolist()
        episodes.append(
            Episode(
                episode_id=f"ep{i}",
                prompt_ids=ids[:p],
                response_ids=ids[p:],
                behavior_logprobs=[-5.0] * r,
                reward=float((i + 1) % 2),
                policy_version=0,
            )
        )
    return collate_episodes(episodes), torch.tensor([ep.reward for ep in episodes])


def _core(model: str, **kw) -> CriticCore:
    return CriticCore(CriticConfig(model=model, device="cpu", **kw))


def test_initial_values_are_zero_and_zero_outside_attended_positions(tiny_model):
    core = _core(tiny_model)
    batch, _ = _batch()
    assert torch.equal(core.batch_values(batch), torch.zeros(batch.input_ids_bt.shape))
    torch.nn.init.normal_(core.model.head.weight, std=1.0)  # make values nonzero
    values_bt = core.batch_values(batch)
    attn_bt = batch.attention_mask_bt.bool()
    valid_bt = attn_bt.clone()
    valid_bt[:, 1:] &= attn_bt[:, :-1]
    valid_bt[:, 0] = False
    assert values_bt.dtype == torch.float32 and values_bt.device.type == "cpu"
    assert (values_bt[~valid_bt] == 0).all()
    assert (values_bt[valid_bt] != 0).all()
    # Position t reads tokens < t only: changing token t leaves values up to t unchanged.
    ids = batch.input_ids_bt.clone()
    ids[:, 4] = (ids[:, 4] + 1) % 200
    with torch.no_grad():
        changed_bt = core.values(ids, batch.attention_mask_bt)
    torch.testing.assert_close(changed_bt[:, :5], values_bt[:, :5])
    assert not torch.allclose(changed_bt[:, 5:], values_bt[:, 5:])


def test_value_loss_drops_on_a_fixed_batch(tiny_model):
    core = _core(tiny_model, optimizer=OptimizerConfig(lr=3e-3))
    batch, rewards_b = _batch()
    values_bt = core.batch_values(batch)
    _, returns_bt = ppo_advantages_for_batch(batch, rewards_b, values_bt)
    # old_values_bt=None: the old values are this step's own forward values (as the app's
    # fresh critic.values(batch) would be), which saves a second forward per step.
    metrics = [core.train_step(batch, returns_bt) for _ in range(12)]
    first, last = metrics[0]["value_loss"], metrics[-1]["value_loss"]
    # V = 0; rows 0 and 2 (2 + 6 of the 15 response tokens) have return 1, the rest 0
    assert first == pytest.approx(0.5 * 8 / 15)
    assert last < first / 5, [m["value_loss"] for m in metrics]
    assert metrics[-1]["explained_variance"] > 0.5
    assert metrics[-1]["step"] == 12.0 and core.step == 12
    for key in ("value_clip_fraction", "value_mean", "return_mean", "grad_norm", "lr", "tokens"):
        assert key in metrics[-1]
    assert metrics[-1]["tokens"] == float(batch.response_mask_bt.sum())


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_micro_batched_gradient_equals_full_batch_gradient(tiny_model, aggregation):
    batch, _ = _batch(5)
    g = torch.Generator().manual_seed(1)
    returns_bt = torch.randn(batch.input_ids_bt.shape, generator=g) * batch.response_mask_bt
    old_bt = torch.randn(batch.input_ids_bt.shape, generator=g) * 0.1
    grads, metrics = [], []
    for micro in (None, 2):
        core = _core(tiny_model, micro_batch_size=micro, aggregation=aggregation)
        torch.manual_seed(2)  # the same nonzero head in both, so the body gets gradients too
        torch.nn.init.normal_(core.model.head.weight, std=0.5)
        metrics.append(core.compute_gradients(batch, returns_bt, old_bt))
        grads.append({n: p.grad.clone() for n, p in core.model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=1e-5, msg=name)
    assert grads[0]["body.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    assert metrics[0] == pytest.approx(metrics[1], rel=1e-5)


def test_save_and_load_restore_values_and_optimizer(tiny_model, tmp_path):
    core = _core(tiny_model, optimizer=OptimizerConfig(lr=1e-2))
    batch, rewards_b = _batch()
    _, returns_bt = ppo_advantages_for_batch(batch, rewards_b, core.batch_values(batch))
    core.train_step(batch, returns_bt)
    core.save(tmp_path / "ckpt")
    saved = core.batch_values(batch)
    after_one = core.train_step(batch, returns_bt)
    assert not torch.equal(core.batch_values(batch), saved)
    assert core.load(tmp_path / "ckpt") == 1
    assert torch.equal(core.batch_values(batch), saved)
    again = core.train_step(batch, returns_bt)
    assert again["value_loss"] == after_one["value_loss"]
    assert again["grad_norm"] == after_one["grad_norm"]
    with pytest.raises(FileNotFoundError, match="not a critic checkpoint"):
        core.load(tmp_path / "nope")


def test_bad_config_and_bad_inputs_are_clear_errors(tiny_model):
    with pytest.raises(ValueError, match="CriticConfig.aggregation"):
        CriticConfig(model=tiny_model, aggregation="dr_grpo")
    with pytest.raises(ValueError, match="CriticConfig.value_clip_eps"):
        CriticConfig(model=tiny_model, value_clip_eps=-1.0)
    with pytest.raises(ValueError, match="CriticConfig.gamma"):
        CriticConfig(model=tiny_model, gamma=1.5)
    with pytest.raises(TypeError, match="CriticConfig.optimizer"):
        CriticConfig(model=tiny_model, optimizer=3)
    assert CriticConfig(model=tiny_model, optimizer={"lr": 0.1}).optimizer.lr == 0.1
    core = _core(tiny_model)
    batch, _ = _batch()
    with pytest.raises(ValueError, match="returns_bt has shape"):
        core.train_step(batch, torch.zeros(2, 3))


def test_per_token_advantages_drive_the_policy_trainer_with_the_ppo_loss(tiny_model):
    """The app's PPO step: critic values -> GAE -> TrainerCore with ``[B, T]`` advantages."""
    from forge.losses import LossConfig
    from forge.training import TrainerConfig, TrainerCore

    critic = _core(tiny_model)
    torch.nn.init.normal_(critic.model.head.weight, std=0.5)
    batch, rewards_b = _batch()
    values_bt = critic.batch_values(batch)
    batch.advantages_b, returns_bt = ppo_advantages_for_batch(batch, rewards_b, values_bt, 1.0, 0.9)
    assert batch.advantages_b.shape == batch.input_ids_bt.shape
    trainer = TrainerCore(
        TrainerConfig(
            model=tiny_model, device="cpu", loss=LossConfig(type="ppo"), micro_batch_size=3
        )
    )
    metrics = trainer.train_step(batch)
    assert metrics["step"] == 1.0 and torch.isfinite(torch.tensor(metrics["loss"]))
    assert critic.train_step(batch, returns_bt, values_bt)["step"] == 1.0


def _rank_batches():
    """Four episodes as one batch and as two rank batches of two (their own padded widths)."""
    batch, rewards_b = _batch(4)
    from forge.replay import collate_episodes as collate

    eps = [
        Episode(
            episode_id=f"ep{i}",
            prompt_ids=ids[: int(p)],
            response_ids=ids[int(p) : int(n)],
            behavior_logprobs=[-5.0] * int(n - p),
            reward=float(rewards_b[i]),
            policy_version=0,
        )
        for i, (ids, p, n) in enumerate(
            zip(
                batch.input_ids_bt.tolist(),
                batch.response_mask_bt.argmax(-1).tolist(),
                batch.attention_mask_bt.sum(-1).tolist(),
            )
        )
    ]
    return batch, [collate(eps[:2]), collate(eps[2:])]


class _InProcessCritic:
    """The two endpoints GAECritic calls, on a real CriticCore in this process."""

    def __init__(self, core: CriticCore) -> None:
        self.core = core
        self.values = self._Endpoint(core.batch_values)
        self.train_step = self._Endpoint(core.train_step)

    class _Endpoint:
        def __init__(self, fn) -> None:
            self.fn = fn

        async def call_one(self, *args):
            return self.fn(*args)


def test_a_step_of_several_rank_batches_is_one_critic_update_on_all_of_them(tiny_model):
    full, parts = _rank_batches()
    g = torch.Generator().manual_seed(3)
    returns_bt = torch.randn(full.input_ids_bt.shape, generator=g) * full.response_mask_bt
    cut = [slice(0, 2), slice(2, 4)]
    rets = [returns_bt[c, : b.input_ids_bt.shape[1]] for c, b in zip(cut, parts)]
    grads, metrics = [], []
    for batch, ret in ((full, returns_bt), (parts, rets)):
        core = _core(tiny_model)
        torch.manual_seed(2)
        torch.nn.init.normal_(core.model.head.weight, std=0.5)
        metrics.append(core.compute_gradients(batch, ret, None))
        grads.append({n: p.grad.clone() for n, p in core.model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=1e-5, msg=name)
    assert metrics[1] == pytest.approx(metrics[0], rel=1e-5)


async def test_gae_critic_steps_once_per_policy_step_and_whitens_the_whole_step(tiny_model):
    from forge.losses.value import whiten
    from forge.run.gae_critic import GAECritic

    full, parts = _rank_batches()
    core = _core(tiny_model)
    torch.nn.init.normal_(core.model.head.weight, std=0.5)
    critic = GAECritic(_InProcessCritic(core), core.cfg, whiten=True)
    targets = await critic.advantages(parts)
    # The same advantages as whitening the one-batch layout of the step.
    values_bt = core.batch_values(full)
    want = whiten(
        ppo_advantages_for_batch(full, full.rewards_b, values_bt)[0], full.response_mask_bt
    )
    for c, b in zip([slice(0, 2), slice(2, 4)], parts):
        torch.testing.assert_close(
            b.advantages_b, want[c, : b.input_ids_bt.shape[1]], atol=1e-5, rtol=0
        )
    m = await critic.train(parts, targets)
    assert core.step == 1 and m["critic/step"] == 1.0
    assert m["critic/tokens"] == float(full.response_mask_bt.sum())
