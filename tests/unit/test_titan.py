"""The torchtitan backend on CPU: SDPA forward/backward and the HF <-> titan name mapping."""

from __future__ import annotations

import sys

import pytest
import torch

from forge.models import load_model, make_tiny_model
from forge.training import OptimizerConfig, TrainerConfig, TrainerCore
from forge.training.titan import import_titan
from tests.episodes import make_batch


@pytest.fixture(scope="module")
def titan_available() -> None:
    """Skip where torchtitan cannot be imported (CI installs it: scripts/setup.sh). A fixture,
    not a module-level check, so that collecting this file costs no torchtitan import (~4 s)."""
    try:
        import_titan()
    except ImportError as e:
        pytest.skip(f"torchtitan unusable: {e}")


needs_titan = pytest.mark.usefixtures("titan_available")


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("llama") / "m", preset="llama", seed=1))


@needs_titan
def test_titan_logprobs_match_hf_and_a_step_trains(llama_model):
    batch = make_batch(llama_model)
    titan = TrainerCore(TrainerConfig(model=llama_model, backend="titan"))
    hf = TrainerCore(TrainerConfig(model=llama_model))
    assert "layers.0.attention.qkv_linear.wq.weight" in dict(titan.model.named_parameters())
    with torch.no_grad():
        lp_titan = titan.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
        lp_hf = hf.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    torch.testing.assert_close(lp_titan, lp_hf, rtol=0, atol=1e-5)

    m_titan, m_hf = titan.train_step(batch), hf.train_step(batch)  # backward through SDPA
    assert m_titan["loss"] == pytest.approx(m_hf["loss"], abs=1e-5)
    assert m_titan["grad_norm"] == pytest.approx(m_hf["grad_norm"], rel=1e-3)


@needs_titan
def test_titan_weights_leave_with_hf_names(llama_model):
    titan = TrainerCore(
        TrainerConfig(model=llama_model, backend="titan", optimizer=OptimizerConfig(lr=1e-2))
    )
    original = load_model(llama_model).state_dict()
    # untouched weights map back to the HF checkpoint exactly (q/k permutation undone)
    hf_names = titan.hf_state_dict()
    assert sorted(hf_names) == sorted(original)
    for name, t in original.items():
        assert torch.equal(hf_names[name], t), name
    assert titan.adapter.from_hf(hf_names).keys() <= dict(titan.model.state_dict()).keys()

    batch = make_batch(llama_model, n=3)
    titan.train_step(batch)
    hf_model = load_model(llama_model)
    hf_model.load_state_dict(titan.hf_state_dict())  # strict: every HF name present
    assert not torch.equal(
        hf_model.state_dict()["model.layers.0.self_attn.q_proj.weight"],
        original["model.layers.0.self_attn.q_proj.weight"],
    )
    from forge.models import token_logprobs

    with torch.no_grad():
        want = titan.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
        got = token_logprobs(hf_model, batch.input_ids_bt, batch.attention_mask_bt)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@needs_titan
def test_titan_rejects_models_it_cannot_map(tiny_model):
    with pytest.raises(ValueError, match="supports HF model types \\('llama',\\), got 'qwen2'"):
        TrainerCore(TrainerConfig(model=tiny_model, backend="titan"))


def test_missing_torchtitan_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchtitan", None)  # what an uninstalled package looks like
    for name in [m for m in sys.modules if m.startswith("torchtitan.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'forge\[titan\]'"):
        import_titan()
