"""TrainerCore on a tiny model, in this process: optimisation, schedule, accumulation, TIS."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from forge.losses import LossConfig
from forge.replay import collate_episodes
from forge.training import (
    OptimizerConfig,
    ScheduleConfig,
    TrainerConfig,
    TrainerCore,
    loss_denominator,
    lr_multiplier,
)
from forge.training.trainer_config import OLD_LOGPROBS
from tests.episodes import make_batch, make_episodes


def _core(model: str, **kw) -> TrainerCore:
    return TrainerCore(TrainerConfig(model=model, **kw))


def _grads(core: TrainerCore) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in core.model.named_parameters() if p.grad is not None}


def test_reinforce_loss_decreases_on_a_fixed_batch(tiny_model):
    core = _core(tiny_model, loss=LossConfig(type="reinforce"), optimizer=OptimizerConfig(lr=3e-3))
    batch = make_batch(tiny_model)
    losses = [core.train_step(batch)["loss"] for _ in range(5)]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < losses[0] - 0.1


def test_grpo_step_raises_logprobs_of_positive_advantage_responses(tiny_model):
    core = _core(tiny_model, optimizer=OptimizerConfig(lr=1e-3))
    batch = make_batch(tiny_model)
    mask = batch.response_mask_bt

    def mean_lp(rows: list[int]) -> float:
        with torch.no_grad():
            lp = core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
        return float((lp[rows] * mask[rows]).sum() / mask[rows].sum())

    pos, neg = [0, 2], [1, 3]  # advantages 1.0, 0.5 and -1.0, -0.5
    before = mean_lp(pos), mean_lp(neg)
    metrics = core.train_step(batch)
    assert {"loss", "grad_norm", "lr", "tokens", "seconds", "step", "ratio_mean"} <= set(metrics)
    assert metrics["tokens"] == float(mask.sum())
    assert metrics["step"] == 1.0 and core.step == 1
    assert mean_lp(pos) > before[0] and mean_lp(neg) < before[1]


def test_grad_clipping_caps_the_norm(tiny_model):
    core = _core(tiny_model, optimizer=OptimizerConfig(lr=1e-4, max_grad_norm=1e-3))
    metrics = core.train_step(make_batch(tiny_model))
    assert metrics["grad_norm"] > 1e-2  # the unclipped norm is reported...
    after = torch.nn.utils.get_total_norm(list(_grads(core).values()))
    assert after.item() == pytest.approx(1e-3, rel=1e-3)  # ...and the step used clipped grads

    unclipped = _core(tiny_model, optimizer=OptimizerConfig(lr=1e-4, max_grad_norm=None))
    m2 = unclipped.train_step(make_batch(tiny_model))
    norm = torch.nn.utils.get_total_norm(list(_grads(unclipped).values()))
    assert m2["grad_norm"] == pytest.approx(norm.item(), rel=1e-5)
    assert m2["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)


def test_schedule_values_by_hand():
    warm = ScheduleConfig(warmup_steps=4)
    assert [lr_multiplier(s, warm) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    lin = ScheduleConfig(warmup_steps=2, decay="linear", total_steps=6)
    assert [lr_multiplier(s, lin) for s in range(8)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0, 0]
    cos = ScheduleConfig(warmup_steps=0, decay="cosine", total_steps=4, min_lr_ratio=0.2)
    expect = [0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * s / 4)) for s in range(4)] + [0.2]
    assert [lr_multiplier(s, cos) for s in range(5)] == pytest.approx(expect)
    assert lr_multiplier(2, cos) == pytest.approx(0.6)


def test_trainer_reports_the_warmup_lr_of_each_step(tiny_model):
    core = _core(
        tiny_model,
        optimizer=OptimizerConfig(lr=1e-3),
        schedule=ScheduleConfig(warmup_steps=4),
    )
    batch = make_batch(tiny_model, n=2)
    lrs = [core.train_step(batch)["lr"] for _ in range(5)]
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])


@pytest.mark.parametrize(
    "loss",
    [
        LossConfig(type="grpo", kl_coef=0.1),
        LossConfig(type="grpo", aggregation="seq_mean"),
        LossConfig(type="reinforce", aggregation="dr_grpo", max_tokens=16),
        LossConfig(type="gspo", tis_cap=2.0),
    ],
    ids=["token_mean+kl", "seq_mean", "dr_grpo", "gspo"],
)
def test_micro_batches_give_the_gradient_of_one_big_batch(tiny_model, loss):
    episodes = make_episodes(tiny_model, n=5)  # lengths differ, so micro-batch token counts do
    batch = collate_episodes(episodes)
    batch.ref_logprobs_bt = batch.behavior_logprobs_bt + 0.3 * batch.response_mask_bt
    # TIS needs the trainer's own old logprobs (with the generator's every weight is 1).
    old = {"old_logprobs": "current"} if loss.tis_cap is not None else {}
    full = _core(tiny_model, loss=loss, length_buckets=False, **old)
    m_full = full.train_step(batch)
    g_full = _grads(full)
    for kw in (
        {"micro_batch_size": 1},
        {"micro_batch_size": 2},  # 2 leaves a ragged last micro-batch of one row
        {"micro_batch_size": 2, "length_buckets": False},  # rows in batch order
        {"bucket_cost_tokens": 0},  # length buckets: every distinct length its own part
        {"max_micro_tokens": 1},  # a token cap: a row a micro-batch
        {"max_micro_tokens": 12},  # pieces of 2-3 rows
    ):
        micro = _core(tiny_model, loss=loss, **kw, **old)
        m_micro = micro.train_step(batch)
        assert m_micro["loss"] == pytest.approx(m_full["loss"], rel=1e-5, abs=1e-7)
        assert m_micro["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-4)
        for name, g in _grads(micro).items():
            torch.testing.assert_close(g, g_full[name], rtol=1e-4, atol=1e-7, msg=name)


def test_length_buckets_split_where_padding_saved_exceeds_the_cost():
    from forge.training.micro_batches import length_cuts, micro_rows

    assert length_cuts([64] * 32, 96) == []  # nothing to save
    assert length_cuts([10] * 8 + [64] * 8, 96) == [8]  # saves 8 x 54 = 432 > 96
    assert length_cuts([60] * 8 + [64] * 8, 96) == []  # saves 32 < 96
    assert length_cuts([1, 2, 3], 0) == [1, 2]
    # a shared prompt is computed once per part that has it: splitting pays it twice
    short_long = [1] * 8 + [9] * 8
    assert length_cuts(short_long, 1) == [8]
    assert length_cuts(short_long, 1, [("p", 100)] * 16) == []  # 282 > 245 positions
    assert length_cuts(short_long, 1, [("p", 10)] * 16) == [8]  # 102 < 155
    assert length_cuts(list(range(300)), 0)[:2] == [3, 6]  # > 128 rows: cuts on blocks of 3
    # identical rows are computed once per part: 8 copies of one short row cost one row
    # (distinct: 60 + 16 x 9 = 204 against 60 + 8 + 60 + 72 = 200, split; copies: 60 + 9 x 9 =
    # 141 against 60 + 1 + 60 + 72 = 193, not)
    assert length_cuts(short_long, 60, None, list(range(16))) == [8]
    assert length_cuts(short_long, 60, None, ["a"] * 8 + list(range(8))) == []
    parts = micro_rows([5, 40, 6, 41, 7], None, "cpu", bucket_cost=10)
    assert [p.tolist() for p in parts] == [[0, 2, 4], [1, 3]]
    assert [p.tolist() for p in micro_rows([5, 40, 6], None, "cpu")] == [[0, 1, 2]]
    assert [p.tolist() for p in micro_rows([5, 40, 6], 2, "cpu", 10)] == [[0, 2], [1]]


def test_loss_denominators():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1.0]])
    assert loss_denominator(mask, "token_mean") == 6
    assert loss_denominator(mask, "seq_mean") == 2
    assert loss_denominator(mask, "dr_grpo") == 3


def test_current_old_logprobs_make_ratio_one_and_tis_weights_from_the_generator(tiny_model):
    batch = make_batch(tiny_model)
    core = _core(tiny_model, old_logprobs="current", loss=LossConfig(type="grpo", tis_cap=2.0))
    with torch.no_grad():
        lp = core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    mask = batch.response_mask_bt
    raw = torch.exp(lp - batch.behavior_logprobs_bt)
    expect_w = float((raw.clamp(max=2.0) * mask).sum() / mask.sum())
    metrics = core.train_step(batch)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["tis_weight_mean"] == pytest.approx(expect_w, rel=1e-5)


@pytest.mark.parametrize(
    ("loss", "old_logprobs"),  # (gspo with the generator's logprobs is refused at load)
    [
        (t, o)
        for t in ("grpo", "ppo", "gspo")
        for o in OLD_LOGPROBS
        if (t, o) != ("gspo", "generator")
    ],
)
def test_on_policy_ratio_is_one_through_the_trainer(tiny_model, loss, old_logprobs):
    """Behaviour logprobs that are the trainer's own at step 0 (on-policy): whichever
    ``old_logprobs`` the trainer uses, the ratio is 1 and nothing is clipped. A denominator
    taken from the wrong rows or positions would move it by the logprobs' spread (nats)."""
    batch = make_batch(tiny_model)
    core = _core(tiny_model, old_logprobs=old_logprobs, loss=LossConfig(type=loss))
    with torch.no_grad():
        lp = core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    batch.behavior_logprobs_bt = torch.where(batch.response_mask_bt.bool(), lp, 0.0)
    metrics = core.train_step(batch)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["logprob_gap"] == pytest.approx(0.0, abs=1e-5)


def test_temperature_scales_the_logits(tiny_model):
    batch = make_batch(tiny_model, n=2)
    cold = _core(tiny_model, temperature=0.5)
    hot = _core(tiny_model, temperature=1.0)
    with torch.no_grad():
        a = cold.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
        b = hot.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    assert not torch.allclose(a, b)
    assert torch.equal(a == 0, b == 0)  # same positions masked


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(optimizer={"type": "sgd"}), "unknown value 'sgd'"),
        (dict(parallelism="tp"), "choose one of \\('ddp', 'fsdp'\\)"),
        (dict(backend="jax"), "TrainerConfig.backend"),
        (dict(old_logprobs="old"), "TrainerConfig.old_logprobs"),
        (dict(micro_batch_size=0), "micro_batch_size must be > 0"),
        (dict(schedule={"decay": "cosine"}), "needs total_steps"),
    ],
)
def test_bad_config_values_raise_clear_errors(tiny_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig(model=tiny_model, **kwargs)


def test_bad_loss_and_optimizer_types_raise_before_any_model_loads():
    with pytest.raises(ValueError, match="unknown loss type: 'dpo'"):
        LossConfig(type="dpo")
    with pytest.raises(ValueError, match="OptimizerConfig.type: unknown value 'lion'"):
        TrainerConfig(model="x", optimizer={"type": "lion"})
    with pytest.raises(TypeError, match="TrainerConfig.loss must be a LossConfig"):
        TrainerConfig(model="x", loss="grpo")


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean"])
def test_streamed_parts_give_the_same_update_as_one_train_step(tiny_model, aggregation):
    """Trajectory streaming: accumulate(part) x 3 + apply_accumulated == train_step(all)."""
    episodes = make_episodes(tiny_model, n=9)
    loss = LossConfig(type="grpo", aggregation=aggregation)
    whole = _core(tiny_model, loss=loss, optimizer=OptimizerConfig(lr=1e-3, max_grad_norm=0.5))
    parts = _core(tiny_model, loss=loss, optimizer=OptimizerConfig(lr=1e-3, max_grad_norm=0.5))
    for _ in range(2):  # two steps: optimizer state carries over the same way
        m_whole = whole.train_step(collate_episodes(episodes))
        for lo, hi in ((0, 2), (2, 7), (7, 9)):  # uneven parts, different padding widths
            parts.accumulate(collate_episodes(episodes[lo:hi]))
        m_parts = parts.apply_accumulated()
        assert m_parts["parts"] == 3 and m_parts["tokens"] == m_whole["tokens"]
        for key in ("loss", "grad_norm"):
            assert m_parts[key] == pytest.approx(m_whole[key], rel=1e-4, abs=1e-6), key
    # Adam divides by sqrt(v): float-rounding differences in near-zero gradients move a weight
    # by up to ~lr, so compare against the update size (lr = 1e-3 x 2 steps), not bitwise.
    worst = max(
        (a - b).abs().max().item()
        for a, b in zip(whole.model.parameters(), parts.model.parameters())
    )
    moved = max(
        (a - b).abs().max().item()
        for a, b in zip(whole.model.parameters(), _core(tiny_model).model.parameters())
    )
    assert worst < 0.05 * moved, (worst, moved)
    with pytest.raises(RuntimeError, match="nothing was accumulated"):
        parts.apply_accumulated()


def test_thread_share_is_reread_at_every_layer_forward_and_backward(tiny_model, monkeypatch):
    from controller import threads

    core = _core(tiny_model)
    layers = core.model.config.num_hidden_layers
    budget = threads.get_budget()
    calls = []
    monkeypatch.setattr(budget, "rebalance", lambda: calls.append(1) or 1)
    core.train_step(make_batch(tiny_model))
    # train_step's own 3 + per layer: before each forward (prefix and tails) and on its gradient
    assert len(calls) >= 3 + 2 * layers
    calls.clear()
    with torch.no_grad():  # no gradient: forward hooks only
        batch = make_batch(tiny_model)
        core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    assert len(calls) == layers
    monkeypatch.setenv("FORGE_THREAD_BUDGET", "0")
    monkeypatch.setattr(threads, "_budget", None)
    from forge.training.hf_trainer import rebalance_per_layer

    assert rebalance_per_layer(core.model) == 0


def test_identical_rows_are_computed_once_with_the_same_update(tiny_model, monkeypatch):
    """Rows i and i + 4 of ``make_episodes(n=8)`` are the same tokens (here with their own
    advantages): computed once, the step's gradients and loss are those of computing every
    row, and ``rows_repeated`` counts the copies."""
    from forge.models import shared_prefix

    eps = make_episodes(tiny_model, n=8)
    eps = [
        dataclasses.replace(e, advantage=a)
        for e, a in zip(eps, [1.0, -1.0, 0.5, -0.5, 0.25, 2.0, -0.75, 1.5])
    ]
    batch = collate_episodes(eps)
    out, grads = {}, {}
    for once in (True, False):
        monkeypatch.setattr(shared_prefix, "REPEATS_ONCE", once)
        core = _core(tiny_model)
        out[once] = core.train_step(batch)
        grads[once] = _grads(core)
    assert out[True]["rows_repeated"] == 4.0 and "rows_repeated" not in out[False]
    assert out[True]["loss"] == pytest.approx(out[False]["loss"], rel=1e-5, abs=1e-7)
    assert out[True]["grad_norm"] == pytest.approx(out[False]["grad_norm"], rel=1e-4)
    assert grads[True].keys() == grads[False].keys()
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, rtol=1e-4, atol=1e-7, msg=name)


def test_a_token_cap_bounds_every_micro_batchs_positions(tiny_model):
    batch = collate_episodes(make_episodes(tiny_model, n=8))
    core = _core(tiny_model, max_micro_tokens=12, bucket_cost_tokens=10**6)
    pieces = core._micro_batches(batch)
    tails = batch.response_mask_bt.sum(-1)
    assert len(pieces) > 1 and sorted(torch.cat(pieces).tolist()) == list(range(8))
    assert all(len(m) == 1 or len(m) * int(tails[m].max()) <= 12 for m in pieces)
