"""The RewardModel actor's constructor, in process (the actor as a service of real processes:
tests/e2e/components/test_reward_model_service.py)."""

from __future__ import annotations

import pytest

from forge.actors.reward_model import RewardModel
from forge.models.reward_classifier import RewardModelConfig, make_tiny_reward_model

ITEMS = [
    ("What is 2+2? ", "4", "4"),
    ("What is 2+2? ", "It is 5.", "4"),
    ("Name a colour.", " Blue", None),
    ("Say hi.", "hello there, how are you doing today?", None),
    ("", "only a response", None),
]
PAIRS = [(p, r) for p, r, _ in ITEMS]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    return str(make_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", preset="tiny"))


def test_actor_takes_a_config_or_a_dict_of_its_fields(rm_dir):
    # The constructor alone, in process: spawning adds nothing here but seconds.
    assert RewardModel({"model": rm_dir, "name": "rm"}).cfg == RewardModelConfig(rm_dir, name="rm")
    with pytest.raises(TypeError, match="takes a RewardModelConfig .*got str"):
        RewardModel(rm_dir)
    with pytest.raises(ValueError, match="unknown key 'modle'"):
        RewardModel({"modle": rm_dir})
