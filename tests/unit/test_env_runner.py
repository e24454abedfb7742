"""run_episode in-process: scripted policy (known ids/logprobs) and scripted environments.

The tokenizer is the tiny model's, trained with BPE merges, and the scripted policy "samples"
one byte-level token per character: a non-canonical tokenisation that re-tokenising the text
would change, so finding the ids verbatim in the trajectory shows they were never re-encoded.
"""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from forge.envs import (
    ChatRenderer,
    EnvContractError,
    Environment,
    FunctionEnv,
    StepResult,
    ToolSet,
    Trajectory,
    as_step_result,
    build_env,
    run_episode,
    tool,
)
from forge.generation.prompts import encode_prompt
from forge.models import load_tokenizer, make_tiny_model
from forge.models.tiny import IM_END_TOKEN
from forge.types import Completion

CORPUS = ["hello world, the answer is 42. " * 20, "guess again: higher lower " * 20]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), corpus=CORPUS)
    return load_tokenizer(str(path))


def _byte_table() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def _byte_ids(tok, text: str) -> list[int]:
    """One token per byte of ``text``: a valid but non-canonical tokenisation."""
    table = _byte_table()
    return tok.convert_tokens_to_ids([table[b] for b in text.encode()])


class ScriptedPolicy:
    """``generate``: turn k samples ``texts[k]`` one byte per token (+ <|im_end|> unless the
    text is marked ``...`` = cut by length), logprob -(k + 1 + j/100) for token j."""

    def __init__(self, tok, texts: list[str], versions: list[int] | None = None):
        self.tok, self.texts = tok, texts
        self.versions = versions or [0] * len(texts)
        self.calls: list[tuple[list[int], dict]] = []
        self.sampled: list[list[int]] = []

    async def __call__(self, prompt_ids: list[int], **sampling) -> list[Completion]:
        k = len(self.calls)
        self.calls.append((list(prompt_ids), sampling))
        text = self.texts[k]
        cut = text.endswith("...")
        ids = _byte_ids(self.tok, text)
        if not cut:
            ids.append(self.tok.convert_tokens_to_ids(IM_END_TOKEN))
        reason = "length" if cut else "stop"
        if len(ids) > sampling["max_tokens"]:
            ids, reason = ids[: sampling["max_tokens"]], "length"
        self.sampled.append(ids)
        logprobs = [-(k + 1 + j / 100) for j in range(len(ids))]
        text = self.tok.decode(ids, skip_special_tokens=True)
        return [Completion("", list(prompt_ids), ids, logprobs, text, reason, self.versions[k])]


class GuessEnv(Environment):
    """Three turns: two wrong guesses, then the right one (done, reward 1)."""

    def __init__(self, answer: str = "42"):
        self.answer, self.turns, self.closed = answer, 0, False

    async def reset(self, task):
        return [{"role": "system", "content": "Guess."}, {"role": "user", "content": task["q"]}]

    async def step(self, action: str) -> StepResult:
        self.turns += 1
        if action.strip() == self.answer:
            return StepResult("correct", reward=1.0, done=True)
        return StepResult("higher", reward=-0.25)

    async def close(self):
        self.closed = True


def _check_alignment(traj: Trajectory, policy: ScriptedPolicy) -> None:
    """Sampled ids verbatim at their spans, mask 1 exactly there, logprobs aligned."""
    assert len(traj.turn_spans) == len(policy.sampled) == traj.num_turns
    mask = [0] * len(traj.token_ids)
    for (start, end), ids, (prompt, _) in zip(traj.turn_spans, policy.sampled, policy.calls):
        assert traj.token_ids[start:end] == ids
        assert traj.token_ids[:start] == prompt  # token-in: each turn saw the whole prefix
        mask[start:end] = [1] * (end - start)
    assert traj.loss_mask == mask
    for i, m in enumerate(mask):
        if not m:
            assert traj.logprobs[i] == 0.0
    for k, (start, end) in enumerate(traj.turn_spans):
        assert traj.logprobs[start:end] == [-(k + 1 + j / 100) for j in range(end - start)]


async def test_three_turns_token_in_token_out(tok):
    policy = ScriptedPolicy(tok, ["hello 7", "hello 40", " 42"], versions=[3, 4, 4])
    env = GuessEnv()
    task = {"q": "the answer?", "id": "t1", "target": "42"}
    traj = await run_episode(env, task, policy, tok, sampling={"max_tokens": 32})
    assert (traj.finish_reason, traj.truncated, traj.num_turns) == ("done", False, 3)
    assert traj.task_id == "t1" and traj.target == "42" and env.closed
    assert traj.turn_versions == [3, 4, 4] and traj.oldest_version == 3
    assert traj.turn_rewards == [-0.25, -0.25, 1.0] and traj.reward == pytest.approx(0.5)
    assert traj.num_sampled_tokens == sum(len(s) for s in policy.sampled)
    _check_alignment(traj, policy)
    assert policy.sampled[0] != tok("hello 7", add_special_tokens=False)["input_ids"] + [3]
    # The prompt is the template rendering of the initial messages.
    chat = ChatRenderer(tok)
    assert traj.token_ids[: traj.prompt_length] == chat.prompt_ids(traj.messages[:2])
    # The whole sequence is what the template renders for the conversation (in text: the
    # ids differ only by the scripted policy's non-canonical tokenisation), and the
    # environment's tokens sit between the turns.
    convo = traj.messages[:-1]  # the last observation ("correct") is never shown
    assert tok.decode(traj.token_ids) + "\n" == chat.render_text(convo, False)
    (s1, e1), (s2, _) = traj.turn_spans[:2]
    between = tok.decode(traj.token_ids[e1:s2])
    assert between == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    assert [m["role"] for m in traj.messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


class KeyedEnv(GuessEnv):
    """GuessEnv whose second answer names its state (``info["state"]``)."""

    async def step(self, action: str) -> StepResult:
        result = await super().step(action)
        if self.turns == 2:
            result.info["state"] = ["after", 2]  # unhashable: kept as its repr
        return result


async def test_turn_states_default_to_the_observation_text(tok):
    policy = ScriptedPolicy(tok, ["hello 7", "hello 40", " 42"])
    traj = await run_episode(
        KeyedEnv(), {"q": "the answer?"}, policy, tok, sampling={"max_tokens": 32}
    )
    # Turn 0 answers the initial messages, turn 1 the text "higher", turn 2 the env's key.
    assert traj.turn_states == ["Guess.\nthe answer?", "higher", "['after', 2]"]


async def test_final_observation_keeps_the_state_a_truncated_episode_was_cut_in(tok):
    policy = ScriptedPolicy(tok, ["hello 7", "hello 40"])
    traj = await run_episode(
        GuessEnv(),
        {"q": "?"},
        policy,
        tok,
        max_turns=2,
        sampling={"max_tokens": 32},
        final_observation=True,
    )
    assert traj.finish_reason == "max_turns" and not traj.truncated
    end = traj.turn_spans[-1][1]
    assert traj.info["final_state_at"] == len(traj.token_ids) > end
    tail = tok.decode(traj.token_ids[end:])
    assert tail.endswith("user\nhigher<|im_end|>\n<|im_start|>assistant\n"), tail
    assert sum(traj.loss_mask[end:]) == 0
    plain = await run_episode(
        GuessEnv(),
        {"q": "?"},
        ScriptedPolicy(tok, ["hello 7", "hello 40"]),
        tok,
        max_turns=2,
        sampling={"max_tokens": 32},
    )
    assert "final_state_at" not in plain.info and len(plain.token_ids) == end


async def test_turn_cut_by_length_gets_the_closing_tokens(tok):
    policy = ScriptedPolicy(tok, ["hello...", "42"])
    traj = await run_episode(GuessEnv(), {"q": "?"}, policy, tok, sampling={"max_tokens": 32})
    assert traj.finish_reason == "done"
    _check_alignment(traj, policy)
    (_, e1), (s2, _) = traj.turn_spans
    im_end = tok.convert_tokens_to_ids(IM_END_TOKEN)
    assert traj.token_ids[e1] == im_end and traj.loss_mask[e1] == 0  # the template's, not sampled
    assert tok.decode(traj.token_ids[e1:s2]).startswith("<|im_end|>\n<|im_start|>user\nhigher")

    policy = ScriptedPolicy(tok, ["hello..."])
    sampling = {"max_tokens": 32}
    ended = await run_episode(
        GuessEnv(), {"q": ""}, policy, tok, sampling=sampling, end_on_length=True
    )
    assert (ended.finish_reason, ended.truncated, ended.num_turns) == ("length", True, 1)


async def test_max_turns(tok):
    policy = ScriptedPolicy(tok, ["1", "2"], versions=[0, 1])
    traj = await run_episode(GuessEnv(), {"q": "?"}, policy, tok, max_turns=2)
    assert (traj.finish_reason, traj.truncated, traj.num_turns) == ("max_turns", False, 2)
    assert traj.token_ids[-1] == tok.convert_tokens_to_ids(IM_END_TOKEN)  # ends on a sample
    _check_alignment(traj, policy)


async def test_max_context_stops_and_caps_turns(tok):
    prompt_len = len(ChatRenderer(tok).prompt_ids(await GuessEnv().reset({"q": "?"})))
    # Room for turn 1 (5 tokens) but not for the observation plus a new turn.
    policy = ScriptedPolicy(tok, ["1234", "5"])
    traj = await run_episode(
        GuessEnv(), {"q": "?"}, policy, tok, max_context_tokens=prompt_len + 10
    )
    assert (traj.finish_reason, traj.truncated, traj.num_turns) == ("max_context", True, 1)
    assert policy.calls[0][1]["max_tokens"] == 10  # no max_tokens given: all the room left
    assert len(traj.token_ids) == prompt_len + 5
    # A turn cut to fit the context ends the episode too.
    policy = ScriptedPolicy(tok, ["123456789"])
    traj = await run_episode(
        GuessEnv(),
        {"q": "?"},
        policy,
        tok,
        max_context_tokens=prompt_len + 4,
        sampling={"max_tokens": 64},
    )
    assert policy.calls[0][1]["max_tokens"] == 4
    assert (traj.finish_reason, traj.truncated, len(traj.token_ids)) == (
        "max_context",
        True,
        prompt_len + 4,
    )
    # A prompt that does not fit at all: nothing sampled.
    traj = await run_episode(GuessEnv(), {"q": "?"}, policy, tok, max_context_tokens=prompt_len)
    assert (traj.finish_reason, traj.num_turns, traj.token_ids) == ("max_context", 0, [])


class RaisingEnv(GuessEnv):
    async def step(self, action):
        if self.turns == 1:
            raise RuntimeError("the env broke")
        return await super().step(action)


class HangingEnv(GuessEnv):
    async def step(self, action):
        await asyncio.sleep(30)


async def test_env_errors_end_the_episode_without_raising(tok):
    env = RaisingEnv()
    policy = ScriptedPolicy(tok, ["1", "2", "3"])
    traj = await run_episode(env, {"q": "?"}, policy, tok)
    assert (traj.finish_reason, traj.num_turns) == ("env_error", 2) and env.closed
    assert "RuntimeError: the env broke" in traj.info["error"]
    assert traj.turn_rewards == [-0.25]  # the failed turn has no reward
    _check_alignment(traj, policy)

    start = time.monotonic()
    traj = await run_episode(
        HangingEnv(), {"q": "?"}, ScriptedPolicy(tok, ["1"]), tok, step_timeout_s=0.2
    )
    assert time.monotonic() - start < 5
    assert traj.finish_reason == "env_error" and "timed out after 0.2 s" in traj.info["error"]

    def bad_reset(state, task):
        raise KeyError("no such task")

    traj = await run_episode(FunctionEnv(bad_reset, lambda s, a: None), {}, policy, tok)
    assert traj.finish_reason == "env_error" and traj.token_ids == [] and traj.num_turns == 0
    assert "KeyError" in traj.info["error"]


async def test_a_wrongly_shaped_env_stops_the_run_instead_of_failing_every_episode(tok):
    """A return value of the wrong shape is a bug, not a failed step: it raises out of the
    episode (naming the method and the value), and the env is still closed."""
    cases = [
        (lambda s, t: "hi", lambda s, a: "not a StepResult", "env.step returned str"),
        (lambda s, t: "hi", lambda s, a: ("obs", 1.0), "env.step returned tuple"),
        (lambda s, t: "hi", lambda s, a: (None, "1", True, {}), "env.step returned tuple"),
        (lambda s, t: "hi", lambda s, a: StepResult(None, reward=None), "a reward is a float"),
        (lambda s, t: 42, lambda s, a: StepResult(), "env.reset returned 42"),
        (lambda s, t: "hi", lambda s, a: StepResult(7), "env.step's observation returned 7"),
    ]
    for reset, step, message in cases:
        closed = []
        env = FunctionEnv(reset, step, closed.append)
        with pytest.raises(EnvContractError, match=message):
            await run_episode(env, {}, ScriptedPolicy(tok, ["1", "2"]), tok)
        assert len(closed) == 1


async def test_gym_style_tuples_are_step_results(tok):
    """step may return (obs, reward, done, info) or gymnasium's five-tuple; reset may return
    (obs, info)."""

    def step(state, action):
        state["n"] = state.get("n", 0) + 1
        if state["n"] == 1:
            return ("higher", -0.25, False, {"state": 1})
        return (None, 1.0, False, True, None)  # gymnasium: truncated

    env = FunctionEnv(lambda s, t: ("guess", {"seed": 3}), step)
    traj = await run_episode(env, {}, ScriptedPolicy(tok, ["1", "2", "3"]), tok)
    assert (traj.finish_reason, traj.num_turns) == ("done", 2)
    assert traj.turn_rewards == [-0.25, 1.0] and traj.turn_states == ["guess", 1]
    assert traj.messages[0] == {"role": "user", "content": "guess"}
    r = as_step_result(("o", {"win": 1.0}, 1, {}))
    assert (r.observation, r.reward, r.done, r.info) == ("o", {"win": 1.0}, True, {})
    assert as_step_result(("o", 0.0, False, True, {})).info == {"truncated": True}


async def test_tool_calls_are_executed_between_turns(tok):
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    call = '<tool_call>{"name": "add", "arguments": {"a": 40, "b": 2}}</tool_call>'
    policy = ScriptedPolicy(tok, [call, "<tool_call>{oops</tool_call>", "42"])
    env = GuessEnv()
    traj = await run_episode(env, {"q": "?"}, policy, tok, tools=ToolSet([add]))
    assert traj.finish_reason == "done" and traj.num_turns == 3
    assert env.turns == 1  # only the final answer reached env.step
    assert traj.turn_rewards == [0.0, 0.0, 1.0]
    assert traj.info["tool_calls"] == 2 and traj.info["tool_errors"] == 1
    assert "<tools>" in traj.messages[0]["content"] and traj.messages[0]["role"] == "system"
    tool_msgs = [m for m in traj.messages if m["role"] == "tool"]
    assert tool_msgs[0] == {"role": "tool", "content": "42", "name": "add"}
    assert "malformed tool call" in tool_msgs[1]["content"]
    _check_alignment(traj, policy)
    (_, e1), (s2, _) = traj.turn_spans[:2]
    assert tok.decode(traj.token_ids[e1:s2]) == (
        "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_a_tool_call_nested_too_deeply_is_a_malformed_call_not_a_crash(tok):
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    hostile = "<tool_call>" + "[" * 1000 + "</tool_call>"  # json.loads: RecursionError
    policy = ScriptedPolicy(tok, [hostile, "42"])
    traj = await run_episode(
        GuessEnv(), {"q": "?"}, policy, tok, tools=ToolSet([add]), max_context_tokens=8192
    )
    assert traj.finish_reason == "done" and traj.num_turns == 2
    assert traj.info["tool_calls"] == 1 and traj.info["tool_errors"] == 1
    [answer] = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "malformed tool call" in answer and "nested too deeply" in answer


async def test_dict_rewards_versions_and_function_env(tok):
    def reset(state, task):
        state["n"] = 0
        return task["q"]  # a string: one user message

    async def step(state, action):
        state["n"] += 1
        return StepResult(
            None, reward={"fmt": 0.5, "ok": float(state["n"] == 2)}, done=state["n"] == 2
        )

    make = functools.partial(FunctionEnv, reset, step)
    policy = ScriptedPolicy(tok, ["a", "b"], versions=[7, 9])
    traj = await run_episode(
        build_env(make),
        {"q": "go", "task_id": "x"},
        policy,
        tok,
        version_of=lambda c: c.generator_version * 10,
        aggregate_reward=lambda rs: sum(r["ok"] + r["fmt"] for r in rs),
    )
    assert traj.finish_reason == "done" and traj.turn_versions == [70, 90]
    assert traj.reward_components == {"fmt": 1.0, "ok": 1.0} and traj.reward == 2.0
    assert traj.messages[0] == {"role": "user", "content": "go"}
    # observation None: the next prompt is just the generation prompt after the closed turn
    (_, e1), (s2, _) = traj.turn_spans
    assert tok.decode(traj.token_ids[e1:s2]) == "\n<|im_start|>assistant\n"


def test_build_env_specs_and_errors():
    assert isinstance(build_env(GuessEnv, answer="7"), GuessEnv)
    assert build_env(lambda: GuessEnv("9")).answer == "9"
    env = build_env("tests.unit.test_env_runner:GuessEnv", answer="3")
    assert type(env).__name__ == "GuessEnv" and env.answer == "3"
    with pytest.raises(ValueError, match="'nope' is not an import string"):
        build_env("nope")
    with pytest.raises(ValueError, match="cannot import 'no_such_pkg_xyz'"):
        build_env("no_such_pkg_xyz:Env")
    with pytest.raises(ValueError, match="has no 'Missing'"):
        build_env("tests.unit.test_env_runner:Missing")
    with pytest.raises(TypeError, match="not a class or factory"):
        build_env(GuessEnv())
    with pytest.raises(TypeError, match="has no reset/step"):
        build_env(dict)


def test_trajectory_checks_alignment_and_reason():
    base = dict(
        task_id="t",
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -1.0],
        turn_versions=[2, 1],
        turn_rewards=[1.0],
        reward=1.0,
        reward_components={},
        num_turns=2,
        finish_reason="done",
    )
    t = Trajectory(**base)
    assert t.oldest_version == 1 and t.num_sampled_tokens == 1
    with pytest.raises(ValueError, match="must align"):
        Trajectory(**{**base, "loss_mask": [1]})
    with pytest.raises(ValueError, match="finish_reason 'oops' is unknown"):
        Trajectory(**{**base, "finish_reason": "oops"})


async def test_bad_arguments_are_rejected(tok):
    with pytest.raises(ValueError, match="one continuation per turn; got n=2"):
        await run_episode(GuessEnv(), {}, ScriptedPolicy(tok, []), tok, sampling={"n": 2})


def test_encode_prompt_token_ids_are_used_verbatim(tok):
    ids = _byte_ids(tok, "hello")
    assert ids != tok("hello")["input_ids"]  # non-canonical, would change if re-encoded
    text, out = encode_prompt(tok, ids)
    assert out == ids and text == "hello"
    assert encode_prompt(tok, "hello")[1] == tok("hello")["input_ids"]
    chat = [{"role": "user", "content": "hi"}]
    text, out = encode_prompt(tok, chat)
    assert text.endswith("<|im_start|>assistant\n") and out == ChatRenderer(tok).prompt_ids(chat)
    with pytest.raises(TypeError, match="only ints >= 0"):
        encode_prompt(tok, [1, "2"])
    with pytest.raises(TypeError, match="only ints >= 0"):
        encode_prompt(tok, [1, -2])
    with pytest.raises(ValueError, match="empty list"):
        encode_prompt(tok, [])
    with pytest.raises(ValueError, match="max_position_embeddings is 3"):
        encode_prompt(tok, [1, 2, 3], max_positions=3)
