"""Shared-prefix logprobs equal plain teacher-forced ones, values and gradients."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.models import load_model, make_tiny_model, token_logprobs
from forge.models.shared_prefix import common_length, shared_prefix_logprobs
from forge.replay.collate import collate_episodes
from forge.types import Episode


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def _episodes(
    groups: int, size: int, multi_turn: bool = False, common: int = 0, seed: int = 0
) -> list[Episode]:
    rng = random.Random(seed)
    system = [rng.randrange(4, 200) for _ in range(common)]  # every prompt starts with it
    out = []
    for g in range(groups):
        prompt = system + [rng.randrange(4, 200) for _ in range(rng.randrange(1, 30))]
        for i in range(size):
            n = rng.randrange(1, 9)
            resp = [rng.randrange(4, 200) for _ in range(n)]
            mask = None
            if multi_turn and n > 3:  # an observation in the middle: not scored
                mask = [1, 1, 0, 0] + [1] * (n - 4)
            out.append(
                Episode(
                    episode_id=f"{g}-{i}",
                    prompt_ids=prompt,
                    response_ids=resp,
                    behavior_logprobs=[-1.0] * n,
                    reward=0.0,
                    policy_version=0,
                    loss_mask=mask,
                )
            )
    return out


@pytest.mark.parametrize("common", [0, 20])  # 20: the prompts' shared start runs once, upstream
@pytest.mark.parametrize("temperature", [0.7, 1.0])  # 1.0: the path that skips the division
@pytest.mark.parametrize("multi_turn", [False, True])
def test_values_and_gradients_match_token_logprobs(model, multi_turn, temperature, common):
    b = collate_episodes(_episodes(groups=3, size=4, multi_turn=multi_turn, common=common))
    _assert_matches_token_logprobs(model, b, temperature)


def _assert_matches_token_logprobs(model, b, temperature: float = 1.0) -> None:
    mask_bt = b.response_mask_bt
    weights_bt = torch.randn(mask_bt.shape) * mask_bt

    model.zero_grad()
    ref_bt = token_logprobs(model, b.input_ids_bt, b.attention_mask_bt, temperature=temperature)
    (ref_bt * weights_bt).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    lp_bt = shared_prefix_logprobs(
        model, b.input_ids_bt, b.attention_mask_bt, mask_bt, temperature=temperature
    )
    assert lp_bt is not None
    (lp_bt * weights_bt).sum().backward()

    assert torch.allclose(lp_bt * mask_bt, ref_bt * mask_bt, atol=1e-5)
    for name, grad in ref_grads.items():
        got = dict(model.named_parameters())[name].grad
        assert torch.allclose(got, grad, atol=1e-5, rtol=1e-4), name


def test_no_sharing_returns_none(model):
    b = collate_episodes(_episodes(groups=6, size=1))
    assert (
        shared_prefix_logprobs(model, b.input_ids_bt, b.attention_mask_bt, b.response_mask_bt)
        is None
    )


@pytest.mark.parametrize("seed", range(6))
def test_common_start_of_uneven_prompts(model, seed):
    """Prompts that share a start and then differ in length (one may be the start plus a
    single token): values and gradients as without sharing."""
    eps = _episodes(groups=4, size=3, common=24, seed=seed)
    eps[0] = Episode(**{**eps[0].__dict__, "prompt_ids": eps[1].prompt_ids[:25]})
    _assert_matches_token_logprobs(model, collate_episodes(eps))


def test_common_length():
    assert common_length([(1, 2, 3, 4), (1, 2, 5)]) == 2
    assert common_length([(1, 2, 3), (1, 2, 3, 4)]) == 2  # each keeps >= 1 token of its own
    assert common_length([(7, 2), (1, 2)]) == 0


def _with_repeats(eps: list[Episode], copies: dict[int, int]) -> list[Episode]:
    """``eps`` with row ``i``'s response (and loss mask) copied into row ``j`` for each
    ``j: i`` in ``copies``."""
    out = list(eps)
    for j, i in copies.items():
        src = eps[i]
        out[j] = Episode(
            **{
                **eps[j].__dict__,
                "response_ids": src.response_ids,
                "behavior_logprobs": src.behavior_logprobs,
                "loss_mask": src.loss_mask,
            }
        )
    return out


@pytest.mark.parametrize("multi_turn", [False, True])
def test_identical_rows_run_once_with_every_copys_gradient(model, multi_turn):
    """Rows that repeat an earlier row of their group (same prompt, same completion) are
    computed once; values and gradients equal every row computed on its own. The same
    completion under another prompt is a different row."""
    eps = _episodes(groups=3, size=4, multi_turn=multi_turn, common=20)
    # group 0: rows 1 and 3 copy row 0; group 1: row 5 copies row 4; row 8 (group 2) takes
    # row 0's completion under its own prompt: not a repeat
    eps = _with_repeats(eps, {1: 0, 3: 0, 5: 4, 8: 0})
    b = collate_episodes(eps)
    _assert_matches_token_logprobs(model, b)
    stats: dict[str, float] = {}
    shared_prefix_logprobs(
        model, b.input_ids_bt, b.attention_mask_bt, b.response_mask_bt, stats=stats
    )
    assert stats["repeated_rows"] == 3


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    picks=st.lists(st.integers(0, 3), min_size=8, max_size=8),
    seed=st.integers(0, 1000),
)
def test_repeats_property(model, picks, seed):
    """Any pattern of repeats inside groups of 4 (row k of a group takes the completion of
    row ``picks[k]`` of that group): logprobs equal the row-by-row computation, and
    ``repeated_rows`` counts the rows beyond each group's distinct completions."""
    eps = _episodes(groups=2, size=4, seed=seed)
    eps = _with_repeats(eps, {k: 4 * (k // 4) + p for k, p in enumerate(picks)})
    b = collate_episodes(eps)
    ref_bt = token_logprobs(model, b.input_ids_bt, b.attention_mask_bt)
    stats: dict[str, float] = {}
    lp_bt = shared_prefix_logprobs(
        model, b.input_ids_bt, b.attention_mask_bt, b.response_mask_bt, stats=stats
    )
    mask_bt = b.response_mask_bt
    assert lp_bt is not None
    assert torch.allclose(lp_bt * mask_bt, ref_bt * mask_bt, atol=1e-5)
    distinct = {(tuple(e.prompt_ids), tuple(e.response_ids)) for e in eps}
    assert stats["repeated_rows"] == len(eps) - len(distinct)
