"""The shared run config: one seed for every role, an app's config lists exactly what it
reads (REINFORCE and SFT are not ``RLConfig``), and loading a config changes none of the
objects it is built from."""

from __future__ import annotations

import dataclasses

import pytest

from apps.pipeline.main import Config as PipelineConfig
from forge.config import config_from_dict, dump_config, load_config
from forge.generation.backend import GeneratorConfig
from forge.rollout.scoring import RolloutConfig
from forge.run.policy import PolicyConfig
from forge.run.rl_config import RLConfig
from forge.training.trainer_config import ReferenceConfig, TrainerConfig
from tests.helpers import REPO


def _rl(**over) -> dict:
    base = {"app": "x", "policy": {"model": "/m"}, "data": "jsonl", "rewards": ["exact_match"]}
    return {**base, **over}


def test_the_runs_seed_is_every_roles_seed():
    ppo = {"critic": {"model": "/m"}, "trainer": {"loss": {"type": "ppo"}}}
    cfg = config_from_dict(RLConfig, _rl(seed=5, **ppo))
    assert (cfg.seed, cfg.trainer.seed, cfg.generator.seed, cfg.critic.seed) == (5, 5, 5, 5)
    cfg = config_from_dict(RLConfig, _rl())  # seed 0: what every role defaulted to before
    assert (cfg.trainer.seed, cfg.generator.seed) == (0, 0)


def test_a_role_seed_other_than_the_runs_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.seed=3 but seed=5: .*remove trainer.seed"):
        config_from_dict(RLConfig, _rl(seed=5, trainer={"seed": 3}))
    # The run's own seed written out per role (a run directory's config.yaml) loads back.
    cfg = config_from_dict(RLConfig, _rl(seed=5, generator={"seed": 5}))
    dump_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml", schema=RLConfig) == cfg
    with pytest.raises(ValueError, match=r"generator.seed=5 but seed=6"):
        load_config(tmp_path / "config.yaml", ["seed=6"], schema=RLConfig)


def test_a_pipelines_seed_reaches_every_stage_and_role():
    cfg = load_config(REPO / "apps/sumdigits/cpu.yaml", ["seed=4"], schema=PipelineConfig)
    assert (cfg.seed, cfg.rl.seed, cfg.sft.seed) == (4, 4, 4)
    assert (cfg.rl.trainer.seed, cfg.rl.generator.seed, cfg.sft.trainer.seed) == (4, 4, 4)
    with pytest.raises(ValueError, match=r"rl.seed=1 but seed=4"):
        load_config(
            REPO / "apps/sumdigits/cpu.yaml", ["seed=4", "rl.seed=1"], schema=PipelineConfig
        )


def _field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_reinforce_config_lists_exactly_what_the_app_reads():
    from apps.reinforce.main import Config

    assert not issubclass(Config, RLConfig)
    assert _field_names(Config) == {
        "app",
        "policy",
        "trainer",
        "data",
        "steps",
        "metrics",
        "threads_per_actor",
        "seed",
        "deterministic",
        "generator",
        "rewards",
        "replicas",
        "weights",
        "rollout",
        "eval",
        "baseline_decay",
    }


@pytest.mark.parametrize(
    "override",
    [
        "max_policy_age=0",
        "trainer_procs=2",
        "checkpoint_every=5",
        "restart_on_failure=1",
        "stream=true",
        "batch_timeout_s=10",
        "whiten_advantages=false",
        "critic.model=/m",
        "reference.model=/m",
        "env.fn=x",
        "reward_model.model=/m",
        "phases=[]",
    ],
)
def test_a_knob_reinforce_ignores_is_an_unknown_key(override):
    from apps.reinforce.main import Config

    key = override.partition("=")[0].partition(".")[0]
    with pytest.raises(ValueError, match=rf"{key}: unknown key '{key}'"):
        load_config(REPO / "apps/reinforce/cpu.yaml", [override], schema=Config)


def test_sft_config_has_no_generator_and_gets_the_runs_seed():
    from apps.sft.main import Config

    path = REPO / "apps/sft/configs/sumdigits.yaml"
    cfg = load_config(path, ["seed=2"], schema=Config)
    assert cfg.trainer.seed == 2
    with pytest.raises(ValueError, match=r"generator: unknown key 'generator'"):
        load_config(path, ["generator.max_batch_size=4"], schema=Config)


def test_loading_a_config_changes_none_of_the_objects_it_is_built_from(capsys):
    reference = ReferenceConfig(model="/m")
    rollout = RolloutConfig(tasks=8)
    cfg = RLConfig(
        app="x",
        policy=PolicyConfig(model="/m"),
        generator=GeneratorConfig(model="/m"),
        trainer=TrainerConfig(model="/m"),
        data="jsonl",
        rewards=["exact_match"],
        reference=reference,
        rollout=rollout,
        deterministic=True,
    )
    # The resolved values live in the config ...
    assert cfg.reference.mode == "separate" and cfg.rollout.tasks == 1
    assert "rollout.tasks: 8 -> 1" in capsys.readouterr().out
    # ... and the objects the caller passed in are as they were.
    assert reference.mode == "auto" and rollout.tasks == 8
