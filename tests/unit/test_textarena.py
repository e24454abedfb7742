"""The textarena adapter with the real package: whole games through Forge's episode runner
(``run_episode``) with a scripted policy, against scripted and random opponents."""

from __future__ import annotations

import pytest

pytest.importorskip("textarena")

from forge.envs import run_episode  # noqa: E402
from forge.integrations.textarena import TextArenaEnv, TextArenaSeeds  # noqa: E402
from forge.models import load_tokenizer, make_tiny_model  # noqa: E402
from forge.rollout.episodes import EnvConfig  # noqa: E402
from forge.slots import ENVIRONMENT  # noqa: E402
from tests.unit.test_env_runner import ScriptedPolicy  # noqa: E402

LOWEST = "tests.integration.envs.textarena_players:lowest_cell"
SAMPLING = {"max_tokens": 32}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))))


async def _play(tok, env, moves, task=None, **kw):
    policy = ScriptedPolicy(tok, moves)
    kw = {"max_turns": len(moves), "max_context_tokens": 8192, "sampling": SAMPLING, **kw}
    return await run_episode(env, task or {"seed": 0}, policy, tok, **kw)


async def test_a_won_game_scores_success(tok):
    # The opponent takes the lowest free cell: 4 -> 0, 2 -> 1, 6 wins the 2-4-6 diagonal.
    env = TextArenaEnv("TicTacToe-v0", opponent=LOWEST)
    traj = await _play(tok, env, ["4", "[2]", "I play [6]"])
    assert (traj.finish_reason, traj.num_turns) == ("done", 3)
    assert traj.reward_components == {"success": 1.0, "invalid": 0.0, "outcome": 0.0}
    assert traj.turn_rewards[:2] == [0.0, 0.0]
    first, second = [m["content"] for m in traj.messages if m["role"] == "user"][:2]
    assert "You are Player 0 in Tic Tac Toe" in first and "Available Moves" in first
    # The next observation holds the opponent's reply and one (the newest) board.
    assert "[Player 1] [0]" in second and second.count("Current Board") == 1
    assert "Player 0 placed their symbol (O) in cell 4." in second  # "4" got its brackets


async def test_a_lost_game_and_a_loss_by_invalid_moves(tok):
    env = TextArenaEnv("TicTacToe-v0", opponent=LOWEST)
    traj = await _play(tok, env, ["8", "5", "3", "7"])  # X takes 0, 1, 2: a row
    assert traj.finish_reason == "done" and traj.num_turns == 3
    assert traj.reward_components == {"success": 0.0, "invalid": 0.0, "outcome": -1.0}

    env = TextArenaEnv("TicTacToe-v0", opponent=LOWEST)
    policy = ScriptedPolicy(tok, ["hello", "[9]", "x"])
    traj = await run_episode(
        env, {}, policy, tok, max_turns=3, sampling=SAMPLING, max_context_tokens=8192
    )
    # textarena's rule: one retry after an invalid move, the second in a row loses.
    assert traj.finish_reason == "done" and traj.num_turns == 2
    assert traj.reward_components == {"success": 0.0, "invalid": -1.0, "outcome": 0.0}
    notice = [m["content"] for m in traj.messages if m["role"] == "user"][1]
    assert "attempted an invalid move" in notice and "[Player 1]" not in notice


async def test_the_invalid_move_is_reported_and_a_valid_retry_plays_on():
    env = TextArenaEnv("TicTacToe-v0", opponent=LOWEST)
    await env.reset({})
    retry = await env.step("[42]")
    assert retry.info == {"invalid_move": True} and not retry.done
    played = await env.step("[4]")
    assert played.info == {"invalid_move": False} and "[Player 1] [0]" in played.observation


async def test_the_random_opponent_plays_valid_moves_and_follows_the_seed():
    async def opponent_moves(seed, seat=0):
        env = TextArenaEnv("TicTacToe-v0", player_id=seat)
        obs = await env.reset({"seed": seed})
        replies = []
        for _ in range(5):  # the model always takes the lowest free cell
            result = await env.step(lowest_cell_of(obs))
            if result.done:
                assert not result.info["invalid_move"]
                assert result.info["rewards"][1 - seat] in (-1, 0, 1)
                return replies, result
            obs = result.observation
            replies.append(obs.split(f"[Player {1 - seat}] ")[1].split("\n")[0])
        raise AssertionError("a TicTacToe game lasts at most 5 moves of each player")

    from tests.integration.envs.textarena_players import lowest_cell as lowest_cell_of

    runs = [await opponent_moves(seed) for seed in range(12)]
    assert runs[3][0] == (await opponent_moves(3))[0]  # one seed, one game
    first_replies = {replies[0] for replies, _ in runs}
    assert len(first_replies) >= 4  # random, not one fixed answer
    assert all(sum(res.reward.values()) in (1.0, 0.0, -1.0) for _, res in runs)
    # Seat 1: the opponent opens, and the model's first observation shows its move.
    env = TextArenaEnv("TicTacToe-v0", player_id=1)
    first = await env.reset({"seed": 5})
    assert "You are Player 1" in first and "[Player 0] [" in first


async def test_random_needs_moves_where_the_game_lists_none(tok):
    # Nim's text names no move but its rules example '[0 3]' (and the moves played).
    traj = await _play(tok, TextArenaEnv("Nim-v0"), ["[0 3]", "[1 1]"])  # pile 0 empty
    assert traj.finish_reason == "env_error" and traj.num_turns == 1
    assert "found no valid move" in traj.info["error"] and "moves=" in traj.info["error"]
    moves = [f"[{p} {q}]" for p in range(3) for q in range(1, 6)]
    for seed in range(4):
        env = TextArenaEnv("Nim-v0", moves=moves)
        traj = await _play(
            tok, env, ["[2 5]", "[1 4]", "[0 3]", "[0 1]", "[1 1]", "[2 1]"], task={"seed": seed}
        )
        assert traj.finish_reason in ("done", "max_turns"), traj.info.get("error")
        if traj.finish_reason == "done":
            assert sum(traj.reward_components.values()) in (1.0, -1.0)


async def test_an_opponent_class_by_import_string():
    env = TextArenaEnv(
        "IteratedRockPaperScissors-v0",
        opponent="tests.integration.envs.textarena_players:AlwaysRock",
        game_kwargs={"num_rounds": 2},
    )
    await env.reset({})
    assert not (await env.step("[paper]")).done
    end = await env.step("[p]")
    assert end.done and end.reward == {"success": 1.0, "invalid": 0.0, "outcome": 0.0}


async def test_resolved_through_the_environment_slot(tok):
    spec = {"fn": "textarena", "kwargs": {"game": "TicTacToe-v0", "opponent": LOWEST}}
    make = ENVIRONMENT.resolve(spec, key="env.fn")
    traj = await _play(tok, make(), ["4", "2", "6"])
    assert traj.reward_components["success"] == 1.0
    EnvConfig(fn=spec)  # a config section accepts it

    with pytest.raises(ValueError, match=r"TicTacToe-v9.*not registered.*TicTacToe-v0"):
        ENVIRONMENT.resolve({"fn": "textarena", "kwargs": {"game": "TicTacToe-v9"}})()
    with pytest.raises(ValueError, match="env.fn: .*no keyword argument.*'gmae'"):
        EnvConfig(fn={"fn": "textarena", "kwargs": {"gmae": "TicTacToe-v0"}})
    with pytest.raises(ValueError, match="neither 'random' nor an import string"):
        TextArenaEnv("TicTacToe-v0", opponent="greedy")
    with pytest.raises(ValueError, match="num_players"):
        await TextArenaEnv("TicTacToe-v0", num_players=3, player_id=2).reset({})


def test_seed_source_keeps_heldout_seeds_out_of_training():
    src = TextArenaSeeds(num_train=50, num_heldout=4, seed=1)
    train = {src.sample()["seed"] for _ in range(300)}
    assert train <= set(range(4, 54)) and len(train) > 40
    assert [t["seed"] for t in src.heldout()] == [0, 1, 2, 3]
    state = src.state_dict()
    again = TextArenaSeeds(num_train=50, num_heldout=4)
    again.load_state_dict(state)
    assert [again.sample() for _ in range(5)] == [src.sample() for _ in range(5)]


PIPELINE = """
app: apps.pipeline.main
base_model: {model}
sft:
  policy: {{model: from-run}}
  steps: {sft_steps}
  batch_size: 8
  data: {{fn: tests.integration.envs.textarena_players:RandomTicTacToeGames, kwargs: {{max_turns: 3}}}}
  trainer:
    loss: {{type: reinforce}}
    optimizer: {{lr: 3.0e-3, max_grad_norm: 1.0}}
rl:
  policy: {{model: from-run, temperature: 1.0}}
  steps: {rl_steps}
  data: {{fn: forge.integrations.textarena:TextArenaSeeds, kwargs: {{num_heldout: 4}}}}
  env:
    fn: {{fn: textarena, kwargs: {{game: TicTacToe-v0, opponent: random}}}}
    max_turns: 3
    max_context_tokens: 512
  rollout: {{prompts_per_step: 2, group_size: 4, max_tokens: 2, tasks: 2}}
  generator: {{max_batch_size: 16}}
  trainer: {{optimizer: {{lr: 1.0e-4}}}}
  eval: {{at_start: false, at_end: false}}
  metrics: [jsonl]
"""
