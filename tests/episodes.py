"""Fake episodes for the trainer/reference tests (``make_episodes``, ``make_batch``); the
``tiny_model`` fixture they use is in ``tests/conftest.py``."""

from __future__ import annotations

from forge.models import load_tokenizer
from forge.replay import collate_episodes
from forge.types import Episode

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
