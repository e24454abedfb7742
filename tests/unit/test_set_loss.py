"""TrainerCore.set_loss: a schedule phase changes the loss between steps, in this process."""

from __future__ import annotations

import dataclasses

import pytest

from forge.training import OptimizerConfig, TrainerConfig, TrainerCore
from forge.training.phases import PhaseTracker
from tests.episodes import make_batch


def test_set_loss_changes_kl_coef_and_type_and_keeps_the_optimizer(tiny_model):
    core = TrainerCore(
        TrainerConfig(model=tiny_model, optimizer=OptimizerConfig(lr=1e-3), loss={"kl_coef": 0.0})
    )
    batch = make_batch(tiny_model)
    # A reference a bit away from the policy, so the KL term is not 0.
    batch = dataclasses.replace(batch, ref_logprobs_bt=batch.behavior_logprobs_bt - 0.5)
    tracker = PhaseTracker(
        [{"at": 1, "loss": {"kl_coef": 0.5}}, {"at": 2, "loss": {"type": "reinforce"}}],
        core.cfg.loss,
    )

    first = core.train_step(batch)
    assert first["loss"] == pytest.approx(first["policy_loss"])  # kl_coef 0: logged only

    core.set_loss(tracker.changes(1).loss)
    second = core.train_step(batch)
    assert second["loss"] == pytest.approx(second["policy_loss"] + 0.5 * second["kl_ref"])
    assert "clip_fraction" in second and core.cfg.loss.kl_coef == 0.5
    # Adam's state carried over (a rebuilt optimizer would be at its first step again).
    state = core.optimizer.state_dict()["state"]
    assert state and all(int(s["step"]) == 2 for s in state.values())

    core.set_loss(tracker.changes(2).loss)
    third = core.train_step(batch)
    assert "logprob_mean" in third and "clip_fraction" not in third
    assert third["loss"] == pytest.approx(third["policy_loss"] + 0.5 * third["kl_ref"])
    assert third["step"] == 3.0

    with pytest.raises(TypeError, match="set_loss takes a LossConfig, got dict"):
        core.set_loss({"kl_coef": 0.1})
