"""The reasoning-gym adapter with the real package: its datasets as a data source, its own
``score_answer`` as the reward, both resolved through Forge's slots."""

from __future__ import annotations

import pickle

import pytest
import yaml

pytest.importorskip("reasoning_gym")

from reasoning_gym import create_dataset  # noqa: E402

from forge.integrations.reasoning_gym import ReasoningGymReward, ReasoningGymSource  # noqa: E402
from forge.rewards import evaluate_rewards  # noqa: E402
from forge.slots import DATA_SOURCE, REWARD  # noqa: E402

# Two one-digit terms: 200 possible questions, so a held-out list of 50 surely collides with
# 300 training draws unless the source removes it.
SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _questions(items: list[dict]) -> set[str]:
    return {it["target"]["question"] for it in items}


@pytest.mark.parametrize("name", ["chain_sum", "count_bits"])
def test_source_items_score_full_marks_with_their_own_answer(name):
    source = ReasoningGymSource(name, size=40, heldout_size=10)
    reward = ReasoningGymReward(name)
    items = [source.sample() for _ in range(40)] + source.heldout()
    assert len({it["task_id"] for it in items[:40]}) == 40  # one pass: each entry once
    for it in items:
        assert isinstance(it["prompt"], str) and it["prompt"] == it["target"]["question"]
        assert it["target"]["metadata"]["source_dataset"] == name
        assert reward(it["prompt"], it["target"]["answer"], it["target"]) == 1.0
    assert pickle.loads(pickle.dumps(items)) == items  # items travel between actors


def test_composite_mixes_datasets_and_scores_each_by_its_own_rule():
    mix = [
        {"name": "chain_sum", "weight": 1.0, "config": {"max_terms": 2}},
        {"name": "spell_backward", "weight": 1.0, "config": {"max_word_len": 5}},
    ]
    source = ReasoningGymSource("composite", size=60, heldout_size=10, datasets=mix)
    reward = ReasoningGymReward("composite", datasets=mix)
    items = source.records + source.heldout()
    assert {it["target"]["metadata"]["source_dataset"] for it in items} == {
        "chain_sum",
        "spell_backward",
    }
    for it in items:
        answer = it["target"]["answer"]
        assert reward(it["prompt"], answer, it["target"]) == 1.0
        assert reward(it["prompt"], answer + "x", it["target"]) < 1.0


def test_heldout_is_disjoint_from_training_and_stable():
    raw = create_dataset("chain_sum", size=300, seed=0, **SMALL)
    held = ReasoningGymSource("chain_sum", size=300, heldout_size=50, seed=0, **SMALL)
    held_q = _questions(held.heldout())
    assert held_q & {e["question"] for e in raw}, "the config must make collisions likely"
    assert not held_q & _questions(held.records)
    assert len(held.heldout()) == len(held_q)  # duplicate questions dropped

    again = ReasoningGymSource("chain_sum", size=300, heldout_size=50, seed=0, **SMALL)
    assert again.heldout() == held.heldout() and again.records == held.records
    other = ReasoningGymSource("chain_sum", size=300, heldout_size=50, seed=1, **SMALL)
    assert other.heldout() == held.heldout()  # an SFT and an RL seed share the held-out list
    assert not held_q & _questions(other.records)
    assert [other.sample() for _ in range(20)] != [again.sample() for _ in range(20)]


def test_state_dict_continues_the_stream():
    source = ReasoningGymSource("chain_sum", size=30, heldout_size=5, seed=3)
    for _ in range(7):
        source.sample()
    state = pickle.loads(pickle.dumps(source.state_dict()))  # checkpoints pickle it
    expected = [source.sample()["task_id"] for _ in range(50)]  # crosses a reshuffle
    resumed = ReasoningGymSource("chain_sum", size=30, heldout_size=5, seed=3)
    resumed.load_state_dict(state)
    assert [resumed.sample()["task_id"] for _ in range(50)] == expected


def test_reward_is_the_packages_own_score():
    entry = ReasoningGymSource("chain_sum", size=5, heldout_size=0, seed=7).sample()["target"]
    answer = entry["answer"]
    reward = ReasoningGymReward("chain_sum")
    package = create_dataset("chain_sum")
    assert reward("q", answer, entry) == 1.0
    assert reward("q", f"I think <answer> {answer} </answer>", entry) == 1.0
    assert reward("q", f"<answer>0</answer> no, <answer>{answer}</answer>", entry) == 1.0
    assert reward("q", f"  {answer}\n", entry) == 1.0  # untagged: the stripped text
    for wrong in [f"1{answer}", f"<answer>{int(answer) + 1}</answer>", "no idea"]:
        score = reward("q", wrong, entry)
        assert score < 1.0
        assert score == package.score_answer(reward.extract(wrong), entry)
    partial = f"9{answer}"  # the package gives partial credit when the answer is inside
    assert 0.0 < reward("q", partial, entry) < 1.0
    assert ReasoningGymReward("chain_sum", binary=True)("q", partial, entry) == 0.0
    restored = pickle.loads(pickle.dumps(reward))  # reward actors receive it pickled
    assert restored("q", answer, entry) == 1.0 and restored("q", partial, entry) < 1.0
    with pytest.raises(TypeError, match="needs the reasoning-gym entry as target"):
        reward("q", answer, answer)


def test_system_prompt_makes_chat_messages():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    item = ReasoningGymSource("chain_sum", size=3, heldout_size=0, system_prompt="direct").sample()
    system, user = item["prompt"]
    assert system == {"role": "system", "content": SYSTEM_PROMPTS["direct"]}
    assert user == {"role": "user", "content": item["target"]["question"]}


def test_resolved_through_forge_slots_from_yaml():
    cfg = yaml.safe_load(
        """
        data: {fn: reasoning_gym, kwargs: {name: chain_sum, size: 20, heldout_size: 4,
                                          max_terms: 3}}
        rewards: [{fn: reasoning_gym, kwargs: {name: chain_sum, size: 20, max_terms: 3}}]
        """
    )
    source = DATA_SOURCE.resolve(cfg["data"], key="data")()
    (reward,) = [REWARD.resolve(r, key=f"rewards[{i}]") for i, r in enumerate(cfg["rewards"])]
    item = source.sample()
    assert item["target"]["metadata"]["num_terms"] <= 3 and len(source.heldout()) <= 4
    result = evaluate_rewards([reward], item["prompt"], item["target"]["answer"], item["target"])
    assert result.components == {"chain_sum": 1.0} and result.total == 1.0


def test_bad_name_or_key_is_a_clear_error():
    # The reward is built when the config loads, so these fail before anything spawns.
    with pytest.raises(ValueError, match=r"rewards\[0\].*no dataset 'chain_sums'.*'chain_sum'"):
        REWARD.resolve({"fn": "reasoning_gym", "kwargs": {"name": "chain_sums"}}, key="rewards[0]")
    with pytest.raises(ValueError, match=r"no config key\(s\) \['max_term'\].*'max_terms'"):
        REWARD.resolve({"fn": "reasoning_gym", "kwargs": {"name": "chain_sum", "max_term": 3}})
    with pytest.raises(ValueError, match="rejects config.*min_terms must be positive"):
        ReasoningGymReward("chain_sum", min_terms=0)
    # A data source is built inside its actor; its check_config raises the same at load.
    spec = {"fn": "reasoning_gym", "kwargs": {"name": "chainsum", "size": 10}}
    with pytest.raises(ValueError, match="^data: .*no dataset 'chainsum'.*'chain_sum'"):
        DATA_SOURCE.resolve(spec, key="data")
    spec = {"fn": "reasoning_gym", "kwargs": {"name": "chain_sum", "seed": 3, "min_terms": 0}}
    with pytest.raises(ValueError, match="^data: .*rejects config.*min_terms must be positive"):
        DATA_SOURCE.resolve(spec, key="data")
    with pytest.raises(ValueError, match=r"count_bits' has no config key\(s\) \['max_digits'\]"):
        ReasoningGymSource("count_bits", max_digits=3)
    with pytest.raises(ValueError, match="all 40 training entries are held-out questions"):
        ReasoningGymSource(
            "chain_sum", size=40, heldout_size=200, min_terms=1, max_terms=1, max_digits=1
        )
