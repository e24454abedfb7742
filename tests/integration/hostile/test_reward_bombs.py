"""Reward bombs: answers that would keep a scorer busy for ever, or crash it. Each case
asserts the scoring returns within its bound (the bomb scores 0 or is named), the answers
around it keep their scores, and no scoring process outlives the test."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from controller import shutdown
from forge.actors.reward import RewardActor
from forge.rewards import MathReward, RewardTimeoutError
from forge.rewards.bounded import BoundedScorer
from forge.rollout.scoring import GroupScorer, RolloutConfig
from tests.helpers import run_script, wait_dead

BOMBS = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{2^{2^{100}}}", "\\boxed{10^{10^{10^{10}}}!}"]


def _children(scorer: BoundedScorer) -> list[int]:
    return [c.proc.pid for c in scorer._children]


def test_math_bombs_score_zero_within_the_bound_and_the_batch_goes_on():
    reward = MathReward(timeout_s=3.0)
    reward("p", "\\boxed{1}", "1")  # the scoring process is up (its start is not timed)
    items = []
    for i, bomb in enumerate(BOMBS):
        items += [("p", f"\\boxed{{{i}}}", str(i)), ("p", f"so {bomb}", "7")]
    t0 = time.monotonic()
    scores = reward.score_batch(items)
    elapsed = time.monotonic() - t0
    assert scores == [1.0, 0.0] * len(BOMBS)
    # At most the bound per bomb, plus a restarted process per bomb that had to be killed.
    assert elapsed < len(BOMBS) * (3.0 + 15.0)
    pids = _children(reward._scorer)
    reward.close()
    assert not wait_dead(pids, 10)


def test_an_answer_stuck_in_c_code_is_killed_at_its_bound():
    scorer = BoundedScorer("tests.integration.hostile.bombs:c_loop", timeout_s=1.0)
    try:
        assert scorer.map([1]) == [{"ok": 1}]
        first = _children(scorer)
        t0 = time.monotonic()
        out = scorer.map([2, -1, 3])
        assert time.monotonic() - t0 < 1.0 + 30.0  # the bound, then a fresh process starts
        assert out == [{"ok": 2}, {"timed_out": 1.0}, {"ok": 3}]
        assert scorer.killed == 1
        assert not wait_dead(first, 5), "the stuck process was not killed"
    finally:
        pids = _children(scorer)
        scorer.close()
    assert not wait_dead(pids, 10)


def test_a_memory_bomb_is_an_error_not_an_oom():
    scorer = BoundedScorer(
        "tests.integration.hostile.bombs:eat_memory", timeout_s=10.0, max_memory_mb=2048
    )
    try:
        out = scorer.map([1, -1, 2])
        assert out[0] == {"ok": 1} and out[2] == {"ok": 2}
        assert out[1]["error"].startswith("MemoryError")
        assert scorer.killed == 0  # the same process went on
    finally:
        scorer.close()


def test_what_the_scored_code_prints_does_not_break_the_protocol():
    scorer = BoundedScorer("tests.integration.hostile.bombs:chatty", timeout_s=10.0)
    try:
        assert scorer.map([1, 2, 3]) == [{"ok": 1}, {"ok": 2}, {"ok": 3}]
    finally:
        scorer.close()


def test_a_process_that_dies_on_an_item_is_retried_once_then_named():
    scorer = BoundedScorer("tests.integration.hostile.bombs:die", timeout_s=10.0)
    try:
        assert scorer.map([1, -1, 2]) == [{"ok": 1}, {"died": 3}, {"ok": 2}]
    finally:
        scorer.close()


def test_math_verify_log_lines_do_not_reach_the_terminal(tmp_path):
    # math-verify logs "Timeout is disabled ..." and "Timeout during parsing: <answer>" as
    # warnings; they stay in the scoring process.
    out = run_script(
        tmp_path,
        f"""
        import logging
        logging.basicConfig(level=logging.INFO)
        from forge.rewards import MathReward
        r = MathReward(timeout_s=3.0)
        print(r.score_batch([("p", a, "2") for a in {BOMBS!r} + ["\\\\boxed{{2}}"]]))
        r.close()
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0.0, 0.0, 0.0, 1.0]"
    assert out.stderr == "", out.stderr


@pytest.fixture
async def stop_actors():
    yield
    await shutdown()


def _hang(prompt, response, target):
    with open(os.environ["HOSTILE_TEST_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)  # a reward function with no bound of its own


async def test_a_reward_service_that_hangs_stops_the_run_with_a_named_error(tmp_path, stop_actors):
    pid_file = tmp_path / "pid"
    env_vars = {"HOSTILE_TEST_PID_FILE": str(pid_file)}
    svc = await RewardActor.options(num_replicas=1, env_vars=env_vars).as_service([_hang])
    scorer = GroupScorer(RolloutConfig(reward_timeout_s=1.0), 1.0, None, None, svc, log=None)
    t0 = time.monotonic()
    with pytest.raises(RewardTimeoutError, match="reward_timeout_s=1.0"):
        await scorer.score(svc, [("p", "r", "t")])
    assert time.monotonic() - t0 < 10
    pid = int(pid_file.read_text())
    await shutdown()
    assert not wait_dead([pid], 30), "the hung reward actor outlived the run"


def _pid(prompt, response, target):
    with open(os.environ["HOSTILE_TEST_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    return 0.0


async def test_math_bombs_through_the_reward_service(tmp_path, stop_actors):
    import psutil

    pid_file = tmp_path / "pid"
    env_vars = {"HOSTILE_TEST_PID_FILE": str(pid_file)}
    svc = await RewardActor.options(num_replicas=1, env_vars=env_vars).as_service(
        [MathReward(timeout_s=3.0), _pid]
    )
    scorer = GroupScorer(RolloutConfig(reward_timeout_s=120.0), 1.0, None, None, svc, log=None)
    items = [("p", "\\boxed{4}", "4"), ("p", BOMBS[0], "4"), ("p", "\\boxed{5}", "4")]
    results = await scorer.score(svc, items)
    assert [r.components["math"] for r in results] == [1.0, 0.0, 0.0]
    # The actor and its scoring process go with the run.
    actor = psutil.Process(int(pid_file.read_text()))
    pids = [actor.pid] + [c.pid for c in actor.children(recursive=True)]
    assert len(pids) >= 2, "no scoring process under the reward actor"
    await asyncio.wait_for(shutdown(), 60)
    assert not wait_dead(pids, 30)
