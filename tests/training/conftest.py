"""Fixtures of the trainer/reference tests: a private tiny model and fake episodes."""

from __future__ import annotations

import pytest

from controller import shutdown
from forge.models import load_tokenizer, make_tiny_model
from forge.replay import collate_episodes
from forge.types import Episode


@pytest.fixture(autouse=True)
async def _stop_everything():
    yield
    await shutdown()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A tiny Qwen2-style model built for this session (not the shared cache, which other
    test runs may be writing to)."""
    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


PROMPTS = ["What is 2+3?", "Sum the digits of 4821.", "Say hi.", "Count to three, please"]
ANSWERS = ["5", "The sum is 15", "hi!", "one two three"]


def make_episodes(model_dir: str, n: int = 4, offset: int = 0) -> list[Episode]:
    """``n`` episodes with real token ids from the tiny tokenizer, varied lengths, advantages
    of both signs and behaviour logprobs near what a random model gives (~ -log(260))."""
    tok = load_tokenizer(model_dir)
    out = []
    for i in range(n):
        k = (i + offset) % len(PROMPTS)
        prompt = tok(PROMPTS[k])["input_ids"]
        response = tok(ANSWERS[k])["input_ids"] + [tok.eos_token_id]
        out.append(
            Episode(
                episode_id=f"ep{i + offset}",
                prompt_ids=prompt,
                response_ids=response,
                behavior_logprobs=[-5.5 - 0.01 * j for j in range(len(response))],
                reward=float(i % 2),
                policy_version=0,
                advantage=[1.0, -1.0, 0.5, -0.5][i % 4],
            )
        )
    return out


def make_batch(model_dir: str, n: int = 4, offset: int = 0):
    return collate_episodes(make_episodes(model_dir, n, offset))
