"""The Generator's checks and weight helpers, in process (the actor itself:
tests/integration/actors/test_generator.py)."""

from __future__ import annotations

import pytest
import torch

from forge.generation.backend import GeneratorConfig, state_dict_checksum
from forge.generation.hf_weights import clone_with_weights, load_in_place, match_weights
from forge.generation.prompts import make_sampling_params
from forge.models import load_model
from forge.types import SamplingParams


def test_sampling_overrides_are_validated():
    defaults = SamplingParams(max_tokens=8, stop=["x"])
    p = make_sampling_params(defaults, {"n": 3, "stop": "y", "temperature": 0})
    assert (p.n, p.max_tokens, p.stop, p.temperature) == (3, 8, ["y"], 0)
    assert defaults.stop == ["x"]
    with pytest.raises(TypeError, match=r"unknown sampling parameter\(s\) \['max_new_tokens'\]"):
        make_sampling_params(defaults, {"max_new_tokens": 4})
    with pytest.raises(TypeError, match="n=True"):
        make_sampling_params(defaults, {"n": True})
    assert make_sampling_params(defaults, {"ignore_eos": True}).ignore_eos
    with pytest.raises(TypeError, match="ignore_eos=1"):
        make_sampling_params(defaults, {"ignore_eos": 1})
    with pytest.raises(ValueError, match="top_p"):
        make_sampling_params(defaults, {"top_p": 0.0})


def test_unknown_backend_and_bad_config():
    with pytest.raises(ValueError, match=r"unknown generator backend 'sglang'; choose one of"):
        GeneratorConfig(model="x", backend="sglang")
    with pytest.raises(ValueError, match="update_mode"):
        GeneratorConfig(model="x", update_mode="eventually")


def test_weight_matching_and_clone(tiny_model_dir):
    model = load_model(tiny_model_dir)
    sd = {k: v + 1.0 for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="lacks.*'bogus'"):
        match_weights(model, {**sd, "bogus": torch.zeros(1)})
    partial = {k: v for k, v in sd.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"miss 1 .*model\.norm\.weight"):
        match_weights(model, partial)
    with pytest.raises(ValueError, match="shape"):
        match_weights(model, {**sd, "model.norm.weight": torch.zeros(3)})
    # The tied lm_head is covered by the embedding alone.
    no_head = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    clone = clone_with_weights(model, no_head)
    assert clone.lm_head.weight is clone.model.embed_tokens.weight
    assert clone.model.norm.weight.data_ptr() == sd["model.norm.weight"].data_ptr()  # no copy
    assert torch.equal(model.model.norm.weight + 1.0, clone.model.norm.weight)  # old untouched
    load_in_place(model, sd)
    assert state_dict_checksum(model.state_dict()) == state_dict_checksum(clone.state_dict())
