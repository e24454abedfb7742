"""SFT conversations are laid out token for token like run_episode's trajectories."""

from __future__ import annotations

import pytest

from forge.envs import Environment, StepResult, run_episode
from forge.envs.conversation import conversation_tokens
from forge.models import load_tokenizer, make_tiny_model
from forge.types import Completion


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))))


class Script(Environment):
    def __init__(self, replies):
        self.replies = list(replies)

    async def reset(self, task):
        return "Guess my number from 1 to 16."

    async def step(self, action):
        reply = self.replies.pop(0)
        return StepResult(reply, reward=float(reply is None), done=reply is None)


async def test_sft_tokens_equal_the_episode_tokens(tok):
    answers, replies = ["8", "12", "10"], ["higher", "lower", None]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    async def generate(prompt_ids, **sampling):  # the policy "samples" the canonical ids
        text = answers[len(calls)]
        calls.append(prompt_ids)
        ids = tok(text, add_special_tokens=False)["input_ids"] + [im_end]
        return [Completion("", list(prompt_ids), ids, [-0.5] * len(ids), text, "stop", 0)]

    calls: list = []
    traj = await run_episode(Script(replies), {}, generate, tok, max_turns=3)
    messages = [{"role": "user", "content": "Guess my number from 1 to 16."}]
    for a, r in zip(answers, replies):
        messages.append({"role": "assistant", "content": a})
        if r is not None:
            messages.append({"role": "user", "content": r})
    ids, mask, prompt_length = conversation_tokens(tok, messages)
    assert ids == traj.token_ids
    assert mask == traj.loss_mask
    assert prompt_length == traj.prompt_length


def test_conversation_needs_an_opening_and_an_answer(tok):
    with pytest.raises(ValueError, match="opening message"):
        conversation_tokens(tok, [{"role": "assistant", "content": "hi"}])
    with pytest.raises(ValueError, match="opening message"):
        conversation_tokens(tok, [{"role": "user", "content": "hi"}])
