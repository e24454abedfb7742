"""The reward model's core in process: a tiny sequence classifier built locally."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from forge.models import make_tiny_model
from forge.models.reward_classifier import (
    RewardModelConfig,
    RewardModelCore,
    make_tiny_reward_model,
)

PAIRS = [
    ("What is 2+2? ", "4"),
    ("What is 2+2? ", "It is 5, because I say so."),
    ("Name a colour.", " Blue"),
    ("", "only a response"),
    ("a much longer prompt that will need a lot of padding next to the others ", "ok"),
]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    return str(make_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", seed=0))


@pytest.fixture(scope="module")
def core(rm_dir) -> RewardModelCore:
    return RewardModelCore(RewardModelConfig(model=rm_dir, device="cpu"))


def _edit_tokenizer_config(src: str, dst, **changes) -> str:
    shutil.copytree(src, dst)
    path = dst / "tokenizer_config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return str(dst)


def test_scores_are_finite_deterministic_floats(core, rm_dir):
    scores = core.score(PAIRS)
    assert len(scores) == len(PAIRS)
    assert all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert len(set(scores)) == len(scores)  # untrained, but it does look at the text
    assert core.score(PAIRS) == scores
    again = RewardModelCore(RewardModelConfig(model=rm_dir, device="cpu"))
    assert again.score(PAIRS) == scores
    assert core.score([]) == []


def test_same_seed_same_model_other_seed_other_model(tmp_path, core):
    same = make_tiny_reward_model(tmp_path / "same", seed=0)
    other = make_tiny_reward_model(tmp_path / "other", seed=1)
    for path, equal in ((same, True), (other, False)):
        scores = RewardModelCore(RewardModelConfig(model=str(path), device="cpu")).score(PAIRS)
        assert (scores == core.score(PAIRS)) is equal


@pytest.mark.parametrize("micro_batch_size", [1, 2, 3, 64])
def test_micro_batching_matches_one_by_one(rm_dir, core, micro_batch_size):
    one_by_one = [core.score([pair])[0] for pair in PAIRS]
    cfg = RewardModelConfig(model=rm_dir, device="cpu", micro_batch_size=micro_batch_size)
    batched = RewardModelCore(cfg).score(PAIRS)
    assert batched == pytest.approx(one_by_one, abs=1e-5)


def test_padding_does_not_change_a_rows_score(rm_dir, core, tmp_path):
    short = ("hi", "!")
    alone = core.score([short])[0]
    padded = core.score([short, ("x" * 100, "y" * 100)])[0]  # padded by ~200 tokens
    assert padded == pytest.approx(alone, abs=1e-5)
    # A tokenizer saved with left padding is still right-padded for scoring.
    left = _edit_tokenizer_config(rm_dir, tmp_path / "left", padding_side="left")
    left_core = RewardModelCore(RewardModelConfig(model=left, device="cpu"))
    assert left_core.score(PAIRS) == pytest.approx(core.score(PAIRS), abs=1e-5)


def test_tokenizer_without_pad_token_pads_with_eos(rm_dir, core, tmp_path):
    no_pad = _edit_tokenizer_config(rm_dir, tmp_path / "nopad", pad_token=None)
    eos_core = RewardModelCore(RewardModelConfig(model=no_pad, device="cpu", micro_batch_size=8))
    assert eos_core.tokenizer.pad_token == eos_core.tokenizer.eos_token
    assert eos_core.model.config.pad_token_id == eos_core.tokenizer.eos_token_id
    # None of PAIRS contains eos, so each row is read at the same token as before.
    assert eos_core.score(PAIRS) == pytest.approx(core.score(PAIRS), abs=1e-5)


def test_long_texts_lose_their_start(rm_dir, core):
    # The tiny tokenizer has no merges: one ASCII character is one token.
    cut = RewardModelCore(RewardModelConfig(model=rm_dir, device="cpu", max_length=8))
    (score,) = cut.score([("x" * 50, "abcdef")])
    assert score == pytest.approx(core.score([("", "xxabcdef")])[0], abs=1e-5)
    # max_length is capped at the model's max_position_embeddings (512 for the tiny presets)
    assert core.max_length == 512


def test_bad_pairs(core):
    with pytest.raises(TypeError, match="list of \\(prompt, response\\) string pairs"):
        core.score("prompt and response")
    with pytest.raises(TypeError, match="pair 1 is \\('q', 'r', 't'\\)"):
        core.score([("q", "r"), ("q", "r", "t")])
    with pytest.raises(TypeError, match="pair 0"):
        core.score([("q", 3)])
    with pytest.raises(ValueError, match="pair 0 has an empty prompt and response"):
        core.score([("", "")])


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"model": ""}, "model must be a model directory"),
        ({"dtype": "fp8"}, "dtype: unknown value 'fp8'"),
        ({"device": "tpu"}, "device: unknown value 'tpu'"),
        ({"max_length": 0}, "max_length must be an int >= 1"),
        ({"micro_batch_size": 2.5}, "micro_batch_size must be an int >= 1"),
        ({"name": ""}, "name must be a non-empty string"),
    ],
)
def test_config_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        RewardModelConfig(**{"model": "/tmp/rm", **changes})


def test_missing_model_and_non_scalar_head(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_tiny_model"):
        RewardModelCore(RewardModelConfig(model=str(tmp_path / "nope")))
    lm = make_tiny_model(tmp_path / "lm", preset="tiny")  # a causal LM: a 2-label head by default
    with pytest.raises(ValueError, match="num_labels=2; a reward model has num_labels=1"):
        RewardModelCore(RewardModelConfig(model=str(lm)))
