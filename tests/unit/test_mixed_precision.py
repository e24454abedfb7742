"""``trainer.autocast``: bf16 matmuls, float32 weights, optimizer state, head and logprobs."""

from __future__ import annotations

import pytest
import torch

from forge.models.logprobs import head_logits
from forge.training.trainer_config import TrainerConfig
from forge.training.trainer_core import TrainerCore, mismatch_metrics
from tests.episodes import make_batch


def test_bad_autocast_settings_are_named(tiny_model):
    with pytest.raises(ValueError, match="autocast: unknown value 'bf16'"):
        TrainerConfig(model=tiny_model, autocast="bf16")
    with pytest.raises(ValueError, match="autocast keeps float32 parameters"):
        TrainerConfig(model=tiny_model, autocast="bfloat16", dtype="bfloat16")


def test_the_head_stays_float32_under_autocast():
    head = torch.nn.Linear(8, 32, bias=False)
    h = torch.randn(2, 3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert head(h).dtype == torch.bfloat16
        out = head_logits(head, h)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, head(h))


def test_an_autocast_step_trains_in_float32_and_tracks_float32(tiny_model):
    batch = make_batch(tiny_model, n=4)
    full = TrainerCore(TrainerConfig(model=tiny_model, device="cpu"))
    mixed = TrainerCore(TrainerConfig(model=tiny_model, device="cpu", autocast="bfloat16"))
    with torch.no_grad():
        lp32 = full.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
        lp16 = mixed.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    assert lp16.dtype == torch.float32
    m = mismatch_metrics(lp16, lp32, batch.response_mask_bt)
    assert 0 < m["logprob_gap"] < 0.05 and m["mismatch_kl"] < 1e-3, m
    before = {k: v.clone() for k, v in mixed.model.state_dict().items()}
    out = mixed.train_step(batch)
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    assert any(not torch.equal(before[k], v) for k, v in mixed.model.state_dict().items())
    assert {"logprob_gap", "logprob_gap_max", "mismatch_kl"} <= set(out)
    assert out["logprob_gap_max"] >= out["logprob_gap"]
