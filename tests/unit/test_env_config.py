"""What an env section may sit next to: reward functions compose (they score the final
answer), the single-turn-only knobs are errors that name themselves."""

from __future__ import annotations

import pytest

from forge.launch import load_app
from tests.helpers import REPO

GUESS = REPO / "apps/guess/cpu.yaml"
EPISODE = "rl.rollout.credit=episode"  # the demo credits turns (gigpo); these need episodes


def test_rewards_next_to_an_env_load_and_score_final_answers():
    _, cfg = load_app(GUESS, [EPISODE, "rl.rewards=[exact_match]"])
    assert cfg.rl.rewards == ["exact_match"] and cfg.rl.env is not None


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        (["rl.rewards=[exact_match]", "rl.rollout.credit=gigpo"], "final answer"),
        (["rl.eval.reward=exact_match"], "eval.reward: set together with env"),
        (["rl.rollout.overlong_buffer=2"], "rollout.overlong_buffer: set together with env"),
        (["rl.replicas.env=1", "rl.env=null", "rl.rewards=[exact_match]"], "no env section"),
    ],
)
def test_single_turn_knobs_next_to_an_env_are_errors(overrides, error):
    with pytest.raises(ValueError, match=error):
        load_app(GUESS, overrides)


def test_history_window_loads_and_takes_only_a_critic_over_turns():
    _, cfg = load_app(GUESS, ["rl.env.history.turns=1", "rl.env.history.keep_task=false"])
    assert (cfg.rl.env.history.turns, cfg.rl.env.history.keep_task) == (1, False)
    with pytest.raises(ValueError, match="rl.env.history: .*turns must be an int >= 0, got -1"):
        load_app(GUESS, ["rl.env.history.turns=-1"])
    with pytest.raises(ValueError, match="history.tunrs"):
        load_app(GUESS, ["rl.env.history.tunrs=1"])
    ppo = [EPISODE, "rl.env.history.turns=0", "rl.trainer.loss.type=ppo"]
    _, cfg = load_app(GUESS, [*ppo, "rl.critic.level=turn"])
    assert cfg.rl.critic.level == "turn"
    for bad in (
        ["rl.critic.level=token"],
        ["rl.critic.level=turn", "rl.critic.bootstrap_truncated=true"],
    ):
        with pytest.raises(ValueError, match="a critic then needs critic.level=turn"):
            load_app(GUESS, [*ppo, *bad])
