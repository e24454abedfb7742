"""The verifiers adapter on the real package (0.4.0), offline, with envs built in code
(``tests/integration/envs/verifiers_envs.py``): episodes through ``forge.envs.run_episode`` with
a scripted policy, the data source, slot resolution, and a short GRPO run."""

from __future__ import annotations

import json
import pickle

import pytest

from forge.envs import run_episode
from forge.integrations.verifiers import VerifiersEnv, VerifiersSource
from forge.models import load_tokenizer, make_tiny_model
from forge.slots import DATA_SOURCE, ENVIRONMENT
from tests.unit.test_env_runner import CORPUS, ScriptedPolicy

ENVS = "tests.integration.envs.verifiers_envs"
SUM, GUESS, TOOLS = f"{ENVS}:load_single", f"{ENVS}:load_multi", f"{ENVS}:load_tools"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny"), corpus=CORPUS)))


async def _play(env, task, tok, texts, **kw):
    return await run_episode(
        env, task, ScriptedPolicy(tok, texts), tok, sampling={"max_tokens": 200}, **kw
    )


@pytest.mark.parametrize("reply,correct,brief", [("7", 1.0, 1.0), ("it is 8", 0.0, 0.0)])
async def test_single_turn_rewards_are_the_rubric(tok, reply, correct, brief):
    source = VerifiersSource(SUM)
    task = next(
        t for t in source.heldout() + [source.sample() for _ in range(12)] if t["target"] == 7
    )
    env = VerifiersEnv(SUM)
    traj = await _play(env, task, tok, [reply])
    assert (traj.finish_reason, traj.num_turns) == ("done", 1)
    assert traj.messages[:2] == [
        {"role": "system", "content": "Answer with the number only."},
        {"role": "user", "content": task["prompt"]},
    ]
    # brief has weight 0.5: the component is score * weight.
    assert traj.reward_components == {"correct": correct, "brief": 0.5 * brief}
    (trace,) = env.traces  # verifiers' own trace of the episode, scored by task.score
    assert trace.rewards["brief"].weight == 0.5
    assert sum(traj.reward_components.values()) == pytest.approx(trace.reward)
    assert trace.metrics["reply_chars"] == len(reply)
    assert trace.last_reply == reply and trace.stop_condition == "agent_completed"


async def test_multi_turn_runs_until_the_env_says_done(tok):
    env = VerifiersEnv(GUESS)
    task = {"vf_task": {"prompt": "Guess my number from 1 to 8.", "secret": 5}}
    traj = await _play(env, task, tok, ["4", "6", "5"])
    assert (traj.finish_reason, traj.num_turns) == ("done", 3)
    said = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert said == ["Guess my number from 1 to 8.", "higher", "lower"]
    assert traj.reward_components == pytest.approx({"found": 1.0, "speed": -0.3})
    assert env.traces[0].num_turns == 3


async def test_a_stop_predicate_and_the_verifiers_turn_limit_end_the_episode(tok):
    task = {"vf_task": {"prompt": "Guess my number from 1 to 8.", "secret": 5}}
    env = VerifiersEnv(GUESS)
    traj = await _play(env, task, tok, ["I give up"])  # GuessTask's @vf.stop gave_up
    assert (traj.finish_reason, traj.num_turns) == ("done", 1)
    assert env.traces[0].stop_condition == "gave_up"
    assert traj.reward_components == pytest.approx({"found": 0.0, "speed": -0.1})
    # The agent's max_turns (verifiers) under Forge's: verifiers ends it, scored.
    env = VerifiersEnv(GUESS, {"max_turns": 2})
    traj = await _play(env, task, tok, ["1", "2", "3"], max_turns=4)
    assert (traj.finish_reason, traj.num_turns) == ("done", 2)
    assert env.traces[0].stop_condition == "max_turns"
    assert traj.reward_components == pytest.approx({"found": 0.0, "speed": -0.2})
    # Forge's max_turns under verifiers': Forge ends it, before verifiers scores.
    env = VerifiersEnv(GUESS)
    traj = await _play(env, task, tok, ["1", "2", "3"], max_turns=2)
    assert (traj.finish_reason, traj.reward_components) == ("max_turns", {})


async def test_tool_env_runs_the_toolset(tok):
    env = VerifiersEnv(TOOLS)
    task = {"vf_task": {"prompt": "What is 12 times 34? Use the tool.", "answer": 408}}
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'
    traj = await _play(env, task, tok, [call, "408"])
    assert (traj.finish_reason, traj.num_turns) == ("done", 2)
    assert '"name": "multiply"' in traj.messages[0]["content"]  # advertised (Hermes)
    assert traj.messages[3] == {"role": "tool", "content": "408", "name": "multiply"}
    assert traj.reward_components == {"correct": 1.0, "used_tool": 0.25}
    (trace,) = env.traces
    (asked, _) = trace.assistant_messages
    assert asked.tool_calls[0].name == "multiply"
    assert json.loads(asked.tool_calls[0].arguments) == {"a": 12, "b": 34}
    assert trace.tool_messages[0].tool_call_id == asked.tool_calls[0].id
    # A malformed call is answered as an error the model sees; the episode goes on.
    env = VerifiersEnv(TOOLS)
    traj = await _play(
        env, task, tok, ['<tool_call>{"name": "multiply", "arguments": {"a": 1}}</tool_call>', "12"]
    )
    assert "missing required argument" in traj.messages[3]["content"]
    assert traj.reward_components == {"correct": 0.0, "used_tool": 0.0}


def test_source_rows_heldout_and_resume():
    source = VerifiersSource(SUM, kwargs={"size": 10}, heldout_size=3, seed=1)
    held = source.heldout()
    assert [t["prompt"] for t in held] == ["1+2=", "2+2=", "3+2="]
    state = source.state_dict()
    first = [source.sample()["task_id"] for _ in range(7)]
    assert sorted(first) == sorted(set(first)) and not set(first) & {t["task_id"] for t in held}
    source.load_state_dict(state)
    assert [source.sample()["task_id"] for _ in range(7)] == first
    assert pickle.loads(pickle.dumps(held)) == held
    with pytest.raises(ValueError, match="leaves no training rows"):
        VerifiersSource(SUM, kwargs={"size": 3}, heldout_size=3)


def test_slots_resolve_and_a_bad_load_is_a_clear_error():
    spec = {"fn": "verifiers", "kwargs": {"load": SUM, "kwargs": {"size": 4}}}
    assert len(DATA_SOURCE.resolve(spec, key="data")().heldout()) == 0
    env = ENVIRONMENT.resolve({"fn": "verifiers", "kwargs": {"load": GUESS}}, key="env.fn")()
    assert isinstance(env, VerifiersEnv) and env.role == "agent"
    with pytest.raises(ValueError, match="takes no keyword argument"):
        ENVIRONMENT.resolve({"fn": "verifiers", "kwargs": {"lod": SUM}}, key="env.fn")
    with pytest.raises(ValueError, match="module 'nope_pkg.envs' failed to import"):
        VerifiersEnv("nope_pkg.envs:load_environment")
    with pytest.raises(ValueError, match="neither 'pkg.module:attr' nor a taskset"):
        VerifiersEnv("no-such-taskset-xyz")
    with pytest.raises(ValueError, match="not a verifiers Env"):
        VerifiersEnv("tests.integration.envs.verifiers_envs:_last_int", {"text": "1"})
    with pytest.raises(ValueError, match="no role 'judge'"):
        VerifiersEnv(SUM, role="judge")
