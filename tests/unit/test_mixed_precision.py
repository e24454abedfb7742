"""``trainer.autocast``: bf16 matmuls, float32 weights, optimizer state, head and logprobs."""

from __future__ import annotations

import pytest
import torch

from forge.models.logprobs import head_logits, set_head_precision, token_logprobs
from forge.training.trainer_config import TrainerConfig
from forge.training.trainer_core import TrainerCore, mismatch_metrics
from tests.episodes import make_batch


def test_bad_autocast_settings_are_named(tiny_model):
    with pytest.raises(ValueError, match="autocast: unknown value 'bf16'"):
        TrainerConfig(model=tiny_model, autocast="bf16")
    with pytest.raises(ValueError, match="autocast keeps float32 parameters"):
        TrainerConfig(model=tiny_model, autocast="bfloat16", dtype="bfloat16")
    with pytest.raises(ValueError, match="autocast_head=True without autocast does nothing"):
        TrainerConfig(model=tiny_model, autocast_head=True)


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


def test_the_head_precision_holds_in_the_models_own_forward_too(tiny_model):
    """One rank's chunked head and the model's own forward (what DDP, FSDP and titan call)
    give the same float32 logits under autocast; ``autocast_head`` leaves both to bf16."""
    from forge.models import load_model

    model = load_model(tiny_model)
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(input_ids=ids).logits.dtype == torch.bfloat16  # autocast's default
        set_head_precision(model, autocast_head=False)
        full = model(input_ids=ids).logits
        split = token_logprobs(model, ids, mask)
        set_head_precision(model, autocast_head=False)  # idempotent
        assert model(input_ids=ids).logits.dtype == torch.float32
        set_head_precision(model, autocast_head=True)
        assert model(input_ids=ids).logits.dtype == torch.bfloat16
        split16 = token_logprobs(model, ids, mask)
    assert full.dtype == torch.float32
    ref = torch.log_softmax(full[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(split[:, 1:], ref, atol=1e-5, rtol=1e-5)
    assert 0 < float((split16 - split).abs().max()) < 0.5
    copy = __import__("copy").deepcopy(model)  # the wrapped forward follows the copy
    set_head_precision(copy, autocast_head=False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        copy.lm_head.weight.mul_(0)
        assert float(copy(input_ids=ids).logits.abs().max()) == 0.0
        assert float(model(input_ids=ids).logits.abs().max()) > 0.0


def test_an_autocast_head_trains_and_reports_a_larger_gap(tiny_model):
    batch = make_batch(tiny_model, n=4)
    full = TrainerCore(TrainerConfig(model=tiny_model, device="cpu"))
    gaps = {}
    for head in (False, True):
        cfg = TrainerConfig(model=tiny_model, device="cpu", autocast="bfloat16", autocast_head=head)
        core = TrainerCore(cfg)
        with torch.no_grad():
            lp = core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
            lp32 = full.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
        gaps[head] = mismatch_metrics(lp, lp32, batch.response_mask_bt)["logprob_gap"]
        assert torch.isfinite(torch.tensor(core.train_step(batch)["loss"]))
    assert gaps[True] > gaps[False], gaps
