"""``trainer.skip_zero_advantage``: rows with advantage 0 are not computed, and the update is
the one a pass over every row gives (their gradient is exactly 0 under the policy losses)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.losses import LossConfig
from forge.replay import collate_episodes
from forge.training.trainer_config import OptimizerConfig, TrainerConfig
from forge.training.trainer_core import TrainerCore
from tests.episodes import make_episodes


def _batch(model_dir: str, advantages: list[float]):
    eps = make_episodes(model_dir, n=len(advantages))
    return collate_episodes([dataclasses.replace(e, advantage=a) for e, a in zip(eps, advantages)])


def _cores(model_dir: str, **kw) -> tuple[TrainerCore, TrainerCore]:
    """Two cores from the same weights: one that skips, one that computes every row."""
    make = lambda skip: TrainerCore(  # noqa: E731
        TrainerConfig(model=model_dir, device="cpu", skip_zero_advantage=skip, **kw)
    )
    return make(None), make(False)


def _assert_same_weights(a: TrainerCore, b: TrainerCore) -> None:
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)


def _assert_same_gradients(a: TrainerCore, b: TrainerCore) -> None:
    """The gradients the last step used (unclipped: ``max_grad_norm=None``). AdamW's first
    step moves every weight by about ``lr`` whatever the gradient's size, so equal weights
    after it would hide a gradient scaled by any constant."""
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        atol = 1e-5 * float(q.grad.abs().max()) + 1e-12  # summation order: relative to the size
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=atol, msg=name)


UNCLIPPED = {"optimizer": OptimizerConfig(max_grad_norm=None)}


def test_skipping_zero_advantage_rows_gives_the_same_update(tiny_model):
    batch = _batch(tiny_model, [1.0, 0.0, -0.5, 0.0, 0.0, 2.0])
    skip, full = _cores(tiny_model)
    out_s, out_f = skip.train_step(batch), full.train_step(batch)
    _assert_same_weights(skip, full)
    assert out_s["rows_skipped"] == 3.0 and "rows_skipped" not in out_f
    assert out_s["loss"] == pytest.approx(out_f["loss"], abs=1e-6)  # the same denominator
    assert out_s["grad_norm"] == pytest.approx(out_f["grad_norm"], rel=1e-5)
    assert out_s["tokens"] == out_f["tokens"]  # counts the whole batch
    # Diagnostics average over the rows that trained: the same as a batch of only those rows.
    eps = make_episodes(tiny_model, n=6)
    kept = collate_episodes(
        [dataclasses.replace(eps[i], advantage=a) for i, a in ((0, 1.0), (2, -0.5), (5, 2.0))]
    )
    out_k = _cores(tiny_model)[1].train_step(kept)
    for key in ("mismatch_kl", "logprob_gap", "entropy_sampled", "ratio_mean"):
        assert out_s[key] == pytest.approx(out_k[key], rel=1e-5), key
    assert out_s["logprob_gap_max"] == pytest.approx(out_k["logprob_gap_max"], rel=1e-5)


def test_a_batch_of_only_zero_advantages_still_steps_the_optimizer(tiny_model):
    """AdamW moves weights on a zero gradient (momentum, weight decay): skipping every row
    must leave zero gradients, not none."""
    skip, full = _cores(tiny_model)
    first = _batch(tiny_model, [1.0, -1.0, 0.5, -0.5])
    zeros = _batch(tiny_model, [0.0, 0.0, 0.0, 0.0])
    for core in (skip, full):
        core.train_step(first)
    before = [p.detach().clone() for p in skip.model.parameters()]
    out_s, out_f = skip.train_step(zeros), full.train_step(zeros)
    _assert_same_weights(skip, full)
    assert any(not torch.equal(b, p) for b, p in zip(before, skip.model.parameters()))
    assert out_s["rows_skipped"] == 4.0 and out_s["loss"] == 0.0 and out_s["grad_norm"] == 0.0
    assert out_f["grad_norm"] == 0.0


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from([0.0, 0.0, 1.0, -1.0, 0.25]), min_size=2, max_size=6))
def test_any_pattern_of_zero_rows_gives_the_same_update(tiny_model, advantages):
    batch = _batch(tiny_model, advantages)
    skip, full = _cores(tiny_model, micro_batch_size=2, **UNCLIPPED)
    skip.train_step(batch)
    full.train_step(batch)
    _assert_same_gradients(skip, full)
    _assert_same_weights(skip, full)


# Per-token advantages (credit over turns): which of a row's response tokens get ``value``.
TOKEN_PATTERNS = {
    "none": lambda j, n: False,
    "first_turn": lambda j, n: j < n // 2,
    "last_turn": lambda j, n: j >= n // 2,
    "all": lambda j, n: True,
}


def _token_batch(model_dir: str, rows: list[tuple[str, float]]):
    """One episode per ``(pattern, value)``: ``value`` on the tokens ``pattern`` picks, 0 on
    the others (as GiGPO gives a turn whose step-level group is all equal its episode's 0)."""
    eps = make_episodes(model_dir, n=len(rows))
    out = []
    for e, (pattern, value) in zip(eps, rows):
        n = len(e.response_ids)
        adv = [value if TOKEN_PATTERNS[pattern](j, n) else 0.0 for j in range(n)]
        out.append(dataclasses.replace(e, advantage=0.0, token_advantages=adv))
    return collate_episodes(out)


def test_rows_with_some_nonzero_token_advantages_are_trained(tiny_model):
    """A GiGPO-style batch: a row trains when any of its tokens has a nonzero advantage,
    even though its prompt positions and its other turns hold 0."""
    rows = [("first_turn", 1.0), ("none", 0.0), ("last_turn", -0.5), ("all", 0.25)]
    batch = _token_batch(tiny_model, rows)
    assert batch.advantages_b.dim() == 2
    skip, full = _cores(tiny_model, **UNCLIPPED)
    out_s, out_f = skip.train_step(batch), full.train_step(batch)
    assert out_s["rows_skipped"] == 1.0
    assert out_s["grad_norm"] == pytest.approx(out_f["grad_norm"], rel=1e-5)
    _assert_same_gradients(skip, full)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.sampled_from(list(TOKEN_PATTERNS)), st.sampled_from([1.0, -1.0, 0.25])),
        min_size=2,
        max_size=5,
    )
)
def test_any_pattern_of_zero_tokens_gives_the_same_gradient(tiny_model, rows):
    batch = _token_batch(tiny_model, rows)
    skip, full = _cores(tiny_model, micro_batch_size=2, **UNCLIPPED)
    out_s = skip.train_step(batch)
    full.train_step(batch)
    assert out_s.get("rows_skipped", 0.0) == sum(p == "none" for p, _ in rows)
    _assert_same_gradients(skip, full)


def test_skip_applies_only_where_it_is_exact(tiny_model):
    batch = _batch(tiny_model, [1.0, 0.0, -1.0, 0.0])
    for loss in (LossConfig(entropy_coef=0.01), LossConfig(type="ppo", kl_coef=0.0)):
        core = TrainerCore(TrainerConfig(model=tiny_model, device="cpu", loss=loss))
        out = core.train_step(batch)
        assert ("rows_skipped" in out) == (loss.entropy_coef == 0), loss
    with pytest.raises(ValueError, match="kl_coef=0.1 adds a KL term"):
        TrainerConfig(model=tiny_model, skip_zero_advantage=True, loss=LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy_coef=0.01 adds an entropy term"):
        TrainerConfig(
            model=tiny_model, skip_zero_advantage=True, loss=LossConfig(entropy_coef=0.01)
        )
    with pytest.raises(TypeError, match="skip_zero_advantage must be true, false or null"):
        TrainerConfig(model=tiny_model, skip_zero_advantage="yes")  # type: ignore[arg-type]
    core = TrainerCore(TrainerConfig(model=tiny_model, device="cpu", skip_zero_advantage=True))
    with pytest.raises(ValueError, match="skipping them would change the update"):
        core.set_loss(LossConfig(kl_coef=0.1))


def test_streamed_parts_skip_zero_rows_and_give_the_same_update(tiny_model):
    """Trajectory streaming skips as train_step does: accumulate over parts (one of them all
    zero) + apply_accumulated == train_step on the whole batch, weights and metrics."""
    advantages = [1.0, 0.0, 0.0, 0.0, -0.5, 0.0, 2.0, 0.0]
    eps = [
        dataclasses.replace(e, advantage=a)
        for e, a in zip(make_episodes(tiny_model, n=8), advantages)
    ]
    streamed, whole = _cores(tiny_model, micro_batch_size=2)
    for lo, hi in ((0, 2), (2, 4), (4, 8)):  # the second part has advantage 0 throughout
        streamed.accumulate(collate_episodes(eps[lo:hi]))
    out_p = streamed.apply_accumulated()
    out_w = whole.train_step(collate_episodes(eps))
    _assert_same_weights(streamed, whole)
    out_s = _cores(tiny_model)[0].train_step(collate_episodes(eps))  # skipping, in one piece
    assert out_p["rows_skipped"] == out_s["rows_skipped"] == 5.0
    assert out_p["parts"] == 3.0 and out_p["tokens"] == out_w["tokens"]
    assert out_p["loss"] == pytest.approx(out_w["loss"], abs=1e-6)
    assert out_p["grad_norm"] == pytest.approx(out_w["grad_norm"], rel=1e-5)
    for key in ("mismatch_kl", "logprob_gap", "entropy_sampled", "ratio_mean"):
        assert out_p[key] == pytest.approx(out_s[key], rel=1e-5), key


def test_streamed_parts_of_only_zero_rows_still_step_the_optimizer(tiny_model):
    streamed, whole = _cores(tiny_model)
    first = _batch(tiny_model, [1.0, -1.0, 0.5, -0.5])
    for core in (streamed, whole):
        core.train_step(first)
    zeros = _batch(tiny_model, [0.0, 0.0, 0.0, 0.0])
    streamed.accumulate(zeros)
    out_p = streamed.apply_accumulated()
    whole.train_step(zeros)
    _assert_same_weights(streamed, whole)
    assert out_p["rows_skipped"] == 4.0 and out_p["loss"] == 0.0 and out_p["grad_norm"] == 0.0
