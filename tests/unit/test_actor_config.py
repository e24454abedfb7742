"""An actor's config argument is read one way (``forge.actors.forge_actor.actor_config``): the
config itself, or a dict of its fields checked like a YAML section; anything else is a
``TypeError`` naming the actor and what it takes."""

from __future__ import annotations

import pytest

from forge.actors.critic import Critic
from forge.actors.forge_actor import actor_config
from forge.actors.reference_model import ReferenceModel
from forge.actors.reward_model import RewardModel
from forge.actors.trainer import Trainer
from forge.training.trainer_config import TrainerConfig


def test_a_config_passes_as_it_is_and_a_dict_is_checked():
    cfg = TrainerConfig(model="m")
    assert actor_config(TrainerConfig, cfg, "Trainer") is cfg
    built = actor_config(TrainerConfig, {"model": "m", "micro_batch_size": 2}, "Trainer")
    assert isinstance(built, TrainerConfig)
    assert (built.model, built.micro_batch_size) == ("m", 2)
    with pytest.raises(ValueError, match=r"(?s)Trainer\(config\).*micro_batch_sise"):
        actor_config(TrainerConfig, {"model": "m", "micro_batch_sise": 2}, "Trainer")


@pytest.mark.parametrize(
    ("actor", "takes"),
    [
        (Trainer, "TrainerConfig"),
        (Critic, "CriticConfig"),
        (ReferenceModel, "ReferenceConfig"),
        (RewardModel, "RewardModelConfig"),
    ],
)
def test_every_model_actor_reads_its_config_the_same_way(actor, takes):
    with pytest.raises(TypeError, match=rf"^{actor.__name__} takes a {takes} \(or a dict"):
        actor("path/to/model")
    with pytest.raises(ValueError, match=rf"(?s){actor.__name__}\(config\).*no_such_key"):
        actor({"model": "m", "no_such_key": 1})
