"""The calculator demo's pieces in-process: tool, environment, data, SFT layout, context budget."""

from __future__ import annotations

import pytest

from apps.calc.task import (
    Calculator,
    CallConversations,
    DirectAnswers,
    Products,
    call_text,
    mul,
    parse_answer,
    tokenizer_corpus,
    tool_conversation,
)
from forge import EnvConfig, build_tools
from forge.envs import HermesToolParser, ToolCall, ToolSet, run_episode
from forge.envs.conversation import conversation_tokens
from forge.models import load_tokenizer, make_tiny_model
from forge.types import Completion


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("calc"), corpus=tokenizer_corpus())
    return load_tokenizer(str(path))


async def test_the_call_parses_and_the_tool_answers():
    text = call_text(347, 892)
    assert text == '<tool_call>{"name":"mul","arguments":{"a":347,"b":892}}</tool_call>'
    [call] = HermesToolParser().parse(text)
    assert call == ToolCall("mul", {"a": 347, "b": 892}, text)
    [result] = await ToolSet([mul]).execute_all([call])
    assert result.ok and result.message == {"role": "tool", "content": "309524", "name": "mul"}


async def test_calculator_checks_the_first_integer_exactly():
    env = Calculator()
    assert await env.reset({"a": 347, "b": 892}) == "What is 347*892?"
    right = await env.step("309524")
    assert right.done and right.reward == {"success": 1.0} and right.observation is None
    for wrong in ("309525", "It is 30952 4", "no idea"):
        r = await env.step(wrong)
        assert r.done and r.reward == {"success": 0.0}
    assert parse_answer("= 12, not 13") == 12 and parse_answer("none") is None


def test_products_sample_by_seed_and_hold_out_a_fixed_set():
    a, b = Products(seed=3), Products(seed=3)
    tasks = [a.sample() for _ in range(50)]
    assert tasks == [b.sample() for _ in range(50)]
    for t in tasks:
        assert 100 <= t["a"] <= 999 and 100 <= t["b"] <= 999
        assert t["target"] == t["a"] * t["b"] and t["prompt"] == f"What is {t['a']}*{t['b']}?"
    held = Products(seed=3, heldout_size=16).heldout()
    assert len(held) == 16 and held == Products(seed=4, heldout_size=16).heldout()
    state = a.state_dict()
    nxt = a.sample()
    b.load_state_dict(state)
    assert b.sample() == nxt
    with pytest.raises(ValueError, match="low <= high"):
        Products(low=10, high=5)


def test_sft_conversations_call_with_right_or_random_factors():
    def calls(wrong_args: float, n: int = 400) -> list[list[dict]]:
        src = CallConversations(wrong_args=wrong_args, seed=0)
        return [src.sample()["messages"] for _ in range(n)]

    def is_right(msgs: list[dict]) -> bool:
        a, b = map(int, msgs[0]["content"][len("What is ") : -1].split("*"))
        return msgs[1]["content"] == call_text(a, b)

    for msgs in calls(1.0):
        # Whatever the factors, the tool's result is their product and the answer repeats it.
        [call] = HermesToolParser().parse(msgs[1]["content"])
        assert msgs[2]["content"] == msgs[3]["content"] == str(mul(**call.arguments))
    assert all(is_right(m) for m in calls(0.0))
    share = sum(is_right(m) for m in calls(0.5)) / 400
    assert 0.4 < share < 0.6
    with pytest.raises(ValueError, match="wrong_args"):
        CallConversations(wrong_args=1.5)
    direct = DirectAnswers(seed=0).sample()["messages"]
    a, b = map(int, direct[0]["content"][len("What is ") : -1].split("*"))
    assert [m["role"] for m in direct] == ["user", "assistant"] and direct[1]["content"] == str(
        a * b
    )


async def test_sft_tokens_are_the_episode_tokens_and_fit_the_context(tok):
    """An episode played with the demo's settings (tools not advertised) has exactly the
    tokens SFT trains on, far inside the context; the Hermes tool listing would not fit."""
    messages = tool_conversation(347, 892, 347, 892)
    replies = iter([messages[1]["content"], messages[3]["content"]])
    im_end = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(prompt_ids, **sampling):
        text = next(replies)
        ids = tok(text, add_special_tokens=False)["input_ids"] + [im_end]
        return [Completion("", prompt_ids, ids, [-0.1] * len(ids), text, "stop", 0)]

    tools = build_tools(["apps.calc.task:mul"], advertise=False)
    traj = await run_episode(
        Calculator(),
        {"a": 347, "b": 892},
        generate,
        tok,
        max_turns=3,
        max_context_tokens=256,
        tools=tools,
    )
    assert traj.finish_reason == "done" and traj.reward_components == {"success": 1.0}
    ids, mask, prompt_length = conversation_tokens(tok, messages)
    assert traj.token_ids == ids and traj.loss_mask == mask
    assert traj.prompt_length == prompt_length
    assert len(ids) < 100  # BPE merges on the task's text: the call is ~25 tokens
    advertised, _ = ToolSet([mul]).prepare(messages[:1], tok)
    listing = tok.apply_chat_template(advertised, tokenize=False, add_generation_prompt=True)
    assert len(tok(listing)["input_ids"]) > 256


def test_tools_can_stay_out_of_the_prompt(tok):
    msgs = [{"role": "user", "content": "What is 1*2?"}]
    assert ToolSet([mul], advertise=False).prepare(msgs, tok) == (msgs, {})
    assert ToolSet([mul]).prepare(msgs, tok)[0][0]["role"] == "system"  # the default
    assert EnvConfig(fn="apps.calc.task:Calculator").advertise_tools is True
    assert build_tools(["apps.calc.task:mul"]).advertise is True
