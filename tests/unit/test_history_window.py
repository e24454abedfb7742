"""History windows: each turn prompted with the recent game, each turn its own training row.

The window's messages by hand; run_episode's rows equal the SFT layout of the same
transcript token for token; split_rows/join_rows cut and rejoin every per-token field; the
reference path gives each row the logprobs of its own window.
"""

from __future__ import annotations

import pytest
import torch

from forge.data.sft import sft_batch
from forge.envs import Environment, HistoryWindow, StepResult, run_episode, window_messages
from forge.envs.chat import ChatRenderer
from forge.envs.conversation import conversation_rows
from forge.losses.value import turn_gae_advantages
from forge.models import load_tokenizer, make_tiny_model
from forge.replay import collate_episodes, join_rows, split_rows
from forge.types import Completion, Episode

S = {"role": "system", "content": "rules"}
T = {"role": "user", "content": "task"}


def _game(turns: int) -> list[dict]:
    msgs = [S, T]
    for k in range(turns):
        msgs += [{"role": "assistant", "content": f"a{k}"}, {"role": "user", "content": f"o{k}"}]
    return msgs


def _text(msgs):
    return [m["content"] for m in msgs]


def test_window_keeps_the_task_and_the_last_turns():
    game = _game(3)  # the next turn is the 4th
    assert _text(window_messages(game, HistoryWindow(0))) == ["rules", "task", "o2"]
    assert _text(window_messages(game, HistoryWindow(1))) == ["rules", "task", "a2", "o2"]
    assert _text(window_messages(game, HistoryWindow(2))) == [
        "rules",
        "task",
        "a1",
        "o1",
        "a2",
        "o2",
    ]
    assert window_messages(game, HistoryWindow(3)) == game  # reaches back to the start
    assert window_messages(game, HistoryWindow(9)) == game
    assert _text(window_messages(game, HistoryWindow(0, keep_task=False))) == ["rules", "o2"]
    assert _text(window_messages(game, HistoryWindow(1, keep_task=False))) == ["rules", "a2", "o2"]
    assert window_messages(_game(0), HistoryWindow(0, keep_task=False)) == _game(0)


def test_window_turns_must_be_a_count():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="history.turns"):
            HistoryWindow(bad)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(str(make_tiny_model(tmp_path_factory.mktemp("tiny"))))


class Piles(Environment):
    async def reset(self, task):
        return "Pile 9. Take 1, 2 or 3."

    async def step(self, action):
        self.k = getattr(self, "k", 0) + 1
        done = self.k == 3
        return StepResult(
            None if done else f"Pile {9 - 2 * self.k}.", reward=float(done), done=done
        )


@pytest.mark.parametrize("window", [HistoryWindow(0), HistoryWindow(1, keep_task=False)])
async def test_episode_rows_are_the_sft_rows_and_each_turn_sees_its_window(tok, window):
    answers = ["1", "2", "3"]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    calls: list[list[int]] = []

    async def generate(prompt_ids, **sampling):
        text = answers[len(calls)]
        calls.append(list(prompt_ids))
        ids = tok(text, add_special_tokens=False)["input_ids"] + [im_end]
        return [Completion("", list(prompt_ids), ids, [-0.5] * len(ids), text, "stop", 7)]

    traj = await run_episode(Piles(), {}, generate, tok, max_turns=3, history=window)
    assert traj.finish_reason == "done" and traj.num_turns == 3
    chat = ChatRenderer(tok)
    for k, prompt in enumerate(calls):  # turn k was sampled from its window alone
        assert prompt == chat.prompt_ids(window_messages(_upto(traj.messages, k), window))
    assert len(calls[2]) < len(chat.prompt_ids(_upto(traj.messages, 2)))  # shorter than all
    ids, mask, p, starts = conversation_rows(tok, traj.messages, window)
    assert (ids, mask, p, starts) == (
        traj.token_ids,
        traj.loss_mask,
        traj.prompt_length,
        traj.row_starts,
    )
    assert [traj.token_ids[s : s + len(calls[k + 1])] for k, s in enumerate(starts)] == calls[1:]
    batch = sft_batch(tok, [{"messages": traj.messages}], window)  # SFT: the same rows
    assert batch.input_ids_bt.shape[0] == 3
    for k, prompt in enumerate(calls):
        assert batch.input_ids_bt[k, : len(prompt)].tolist() == prompt


def _upto(messages, k):
    """The transcript before the model's turn k."""
    said = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return messages[: said[k]]


async def test_history_refuses_final_observation(tok):
    with pytest.raises(ValueError, match="final_observation"):
        await run_episode(Piles(), {}, None, tok, history=HistoryWindow(0), final_observation=True)


def _episode() -> Episode:
    # prompt [1, 2] | row 0: sampled 3 4 | row 1: prompt 5 6, sampled 7 | row 2: prompt 8, sampled 9
    return Episode(
        "e",
        [1, 2],
        [3, 4, 5, 6, 7, 8, 9],
        [-0.3, -0.4, 0, 0, -0.7, 0, -0.9],
        reward=1.0,
        policy_version=3,
        advantage=0.5,
        loss_mask=[1, 1, 0, 0, 1, 0, 1],
        token_advantages=[0.1, 0.1, 0, 0, 0.2, 0, 0.3],
        ref_logprobs=[-1, -1, 0, 0, -2, 0, -3],
        turn_rewards=[0.0, 0.0, 1.0],
        row_starts=[2, 5],
    )


def test_split_rows_cuts_every_per_token_field():
    rows = split_rows(_episode())
    assert [(r.prompt_ids, r.response_ids) for r in rows] == [
        ([1, 2], [3, 4]),
        ([5, 6], [7]),
        ([8], [9]),
    ]
    assert [r.behavior_logprobs for r in rows] == [[-0.3, -0.4], [-0.7], [-0.9]]
    assert [r.token_advantages for r in rows] == [[0.1, 0.1], [0.2], [0.3]]
    assert [r.ref_logprobs for r in rows] == [[-1, -1], [-2], [-3]]
    assert [r.loss_mask for r in rows] == [[1, 1], [1], [1]]
    assert {(r.reward, r.advantage, r.policy_version) for r in rows} == {(1.0, 0.5, 3)}
    assert [r.turn_rewards for r in rows] == [[0.0], [0.0], [1.0]]
    assert join_rows(rows, [r.ref_logprobs for r in rows]) == _episode().ref_logprobs
    no_rows = Episode("x", [1], [2], [0.0], reward=0.0, policy_version=0)
    assert split_rows(no_rows) == [no_rows]


def test_collate_makes_a_row_per_turn():
    batch = collate_episodes([_episode(), Episode("x", [1], [2], [-0.2], 0.0, 0)])
    assert batch.input_ids_bt.shape == (4, 4)
    assert batch.input_ids_bt[1].tolist() == [5, 6, 7, 0]
    assert batch.response_mask_bt[1].tolist() == [0, 0, 1, 0]
    assert batch.advantages_b[1].tolist() == pytest.approx([0, 0, 0.2, 0])
    assert batch.advantages_b[3].tolist() == pytest.approx([0, 0, 0, 0])  # x: 0.0 everywhere
    bad = _episode()
    bad.row_starts = [5, 2]
    with pytest.raises(ValueError, match="row_starts"):
        collate_episodes([bad])


def test_gae_over_turns_runs_across_an_episodes_rows():
    """PPO over turns with a window: V_k read in turn k's own row, the recursion across the
    rows: rewards 0, 0, 1; V = 0.2, 0.5, 0.7; gamma 0.9, lambda 0.8 (by hand)."""
    other = Episode("x", [1], [2, 3], [-0.2, -0.3], 0.0, 0, turn_rewards=[0.5])
    batch = collate_episodes([_episode(), other])
    assert batch.row_episode_b.tolist() == [0, 0, 0, 1]
    values_bt = torch.zeros(4, 4)
    values_bt[0, 2], values_bt[1, 2], values_bt[2, 1], values_bt[3, 1] = 0.2, 0.5, 0.7, 0.1
    adv_bt, ret_bt = turn_gae_advantages(
        batch.turn_rewards,
        values_bt,
        batch.response_mask_bt,
        0.9,
        0.8,
        batch.bootstrap_at_b,
        batch.row_episode_b,
    )
    a2 = 1 - 0.7
    a1 = 0.9 * 0.7 - 0.5 + 0.72 * a2
    a0 = 0.9 * 0.5 - 0.2 + 0.72 * a1
    assert adv_bt[0].tolist() == pytest.approx([0, 0, a0, a0])
    assert adv_bt[1].tolist() == pytest.approx([0, 0, a1, 0])
    assert adv_bt[2].tolist() == pytest.approx([0, a2, 0, 0])
    assert adv_bt[3].tolist() == pytest.approx([0, 0.4, 0.4, 0])  # its own episode: 0.5 - 0.1
    assert ret_bt[1, 2].item() == pytest.approx(a1 + 0.5)
    alone, _ = turn_gae_advantages(batch.turn_rewards, values_bt, batch.response_mask_bt)
    assert alone[0, 2].item() == pytest.approx(-0.2)  # without the map a row is an episode
