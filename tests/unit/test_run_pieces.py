"""Unit tests of the run's machinery in ``forge.run`` that need no process: which deaths a
checkpoint can undo, the policy's facts flowing to its roles, the step row, the rollout
manager's reconfiguration."""

from __future__ import annotations

import pytest

from controller import ActorDiedError
from forge import M, PolicyConfig, RolloutManager, step_row
from forge.config import config_from_dict
from forge.run.policy import check_policy, policy_defaults, retarget
from forge.run.supervise import Roles, TrainerDiedError


class _Mesh:
    def __init__(self, *pids: int):
        self.pids = list(pids)


def test_roles_name_the_deaths_a_checkpoint_can_undo():
    """Watched actors (by their processes), not mesh names: a service replica's death or a
    critic's is not the run's to undo."""
    roles = Roles()
    roles.watch(_Mesh(4242, 4243), "trainer")
    roles.watch(_Mesh(7), "replay buffer")
    died = ActorDiedError("Trainer-2", 1, 4243, -9)
    assert roles.died(died) == ("trainer", died)
    try:  # a rollout loop's failure wraps the death as its cause
        raise RuntimeError("a rollout loop failed") from ActorDiedError("ReplayBuffer-5", 0, 7)
    except RuntimeError as e:
        assert roles.died(e)[0] == "replay buffer"
    assert roles.died(ActorDiedError("Trainer-9", 0, 99, -9)) is None  # not watched
    assert roles.died(ValueError("x")) is None


def test_trainer_died_error_names_role_process_and_checkpoint(tmp_path):
    died = ActorDiedError("Trainer-2", 0, 4242, -9)
    e = TrainerDiedError("trainer", died, 6, tmp_path / "step_000006", 0, 0)
    assert str(e).startswith("the run's trainer died: process for mesh 'Trainer-2'")
    assert "last checkpoint: step 6" in str(e) and "restart_on_failure=0" in str(e)
    import pickle

    assert str(pickle.loads(pickle.dumps(e))) == str(e)


def test_policy_facts_flow_to_roles_that_do_not_state_them():
    data = {
        "policy": {"model": "/m", "temperature": 0.5},
        "trainer": {"loss": {"type": "grpo"}},
        "reference": {"model": "/other"},  # a reference from another checkpoint, on purpose
    }
    out = policy_defaults(data, ("generator", "trainer", "reference", "critic"))
    assert out["generator"] == {"model": "/m"}
    assert out["trainer"]["model"] == "/m" and out["trainer"]["temperature"] == 0.5
    assert out["reference"] == {"model": "/other", "temperature": 0.5}
    assert "critic" not in out  # a role the config leaves out stays out


def test_a_role_that_contradicts_the_policy_is_an_error():
    from forge import GeneratorConfig, ReferenceConfig, TrainerConfig

    policy = PolicyConfig(model="/m", temperature=0.7)
    with pytest.raises(ValueError, match=r"trainer.temperature=1.0 but policy.temperature=0.7"):
        check_policy(policy, trainer=TrainerConfig(model="/m"))
    with pytest.raises(ValueError, match=r"generator.model='/x' but policy.model='/m'"):
        check_policy(policy, generator=GeneratorConfig(model="/x"))
    # a reference may use another model, but never another temperature
    check_policy(policy, reference=ReferenceConfig(model="/x", temperature=0.7))
    with pytest.raises(ValueError, match="reference.temperature"):
        check_policy(policy, reference=ReferenceConfig(model="/m"))


def test_retarget_moves_the_policy_and_the_roles_that_followed_it():
    from forge import RLConfig

    cfg = config_from_dict(
        RLConfig,
        {
            "app": "x",
            "policy": {"model": "from-run"},
            "data": "jsonl",
            "rewards": ["exact_match"],
            "reference": {},
            "critic": {"model": "/value-model"},
            "trainer": {"loss": {"type": "ppo"}},
        },
    )
    retarget(cfg, "/sft")
    assert cfg.policy.model == cfg.generator.model == cfg.trainer.model == "/sft"
    assert cfg.reference.model == "/sft" and cfg.critic.model == "/value-model"


def test_renamed_keys_say_where_their_fact_lives_now():
    from forge import RLConfig

    for key, new in (("num_generators", "replicas.generator"), ("model", "policy.model")):
        with pytest.raises(ValueError, match=rf"{key} is now {new}"):
            config_from_dict(
                RLConfig, {"app": "x", "policy": {"model": "/m"}, "data": "jsonl", key: 2}
            )


def test_step_row_names_the_metrics_forge_top_reads():
    row = step_row({"loss": 0.5, "tokens": 100.0}, wait_s=0.1, train_s=0.5, sync_s=0.05)
    assert row[M.LOSS] == 0.5 and row[M.TOKENS_PER_S] == pytest.approx(200.0)
    assert row[M.STEP_S] == pytest.approx(0.65) and row[M.WAIT_BATCH_S] == 0.1


async def test_rollout_manager_reconfigure_sets_the_budget_as_init_does():
    async def nothing():
        return None

    async def consume(group):
        return None

    m = RolloutManager(nothing, consume, groups_per_step=3, over_sampling_factor=1.5)
    assert m.budget == 5  # ceil(4.5)
    m.reconfigure(filter_fn=None, over_sampling_factor=2.0, partial=False)
    assert (m.budget, m.partial, m.filter_fn) == (6, False, None)
    with pytest.raises(ValueError, match="over_sampling_factor"):
        m.reconfigure(filter_fn=None, over_sampling_factor=0.5, partial=True)


def test_deterministic_says_what_it_changes(capsys):
    from forge import RLConfig

    cfg = config_from_dict(
        RLConfig,
        {
            "app": "x",
            "policy": {"model": "/m"},
            "data": "jsonl",
            "rewards": ["exact_match"],
            "rollout": {"tasks": 8},
            "deterministic": True,
        },
    )
    assert (cfg.threads_per_actor, cfg.max_policy_age, cfg.rollout.tasks) == (1, 0, 1)
    out = capsys.readouterr().out
    assert "max_policy_age: 1 -> 0" in out and "rollout.tasks: 8 -> 1" in out


def test_a_pipeline_hands_deterministic_to_its_stages():
    from forge.run.pipeline import with_stage_defaults

    data = {
        "deterministic": True,
        "sft": {"app": "a"},
        "rl": {"app": "b", "deterministic": False},
    }
    out = with_stage_defaults(data)
    assert out["sft"]["deterministic"] is True and out["rl"]["deterministic"] is False


def test_a_pipeline_fills_stage_apps_and_names_the_renamed_section():
    from apps.pipeline.main import STAGE_APPS
    from forge.run.pipeline import with_stage_defaults

    out = with_stage_defaults({"sft": {"steps": 3}, "rl": {"app": "mine.main"}}, STAGE_APPS)
    assert out["sft"]["app"] == "apps.sft.main" and out["rl"]["app"] == "mine.main"
    assert "app" not in with_stage_defaults({"sft": {"steps": 3}})["sft"]  # forge names none
    with pytest.raises(ValueError, match="now the section 'rl:'"):
        with_stage_defaults({"sft": {}, "grpo": {}})


def test_a_stage_without_an_app_is_named_unless_the_pipeline_app_gives_one(tmp_path):
    from apps.pipeline.main import Config
    from forge.config import load_config
    from forge.run.pipeline import PipelineConfig

    yaml = tmp_path / "p.yaml"  # sections that name no app, as apps/arith's configs
    yaml.write_text(
        "app: apps.pipeline.main\nbase_model: /m\n"
        "sft: {policy: {model: from-run}, data: jsonl, trainer: {loss: {type: reinforce}}}\n"
        "rl: {policy: {model: from-run}, data: jsonl, rewards: [exact_match]}\n"
    )
    with pytest.raises(ValueError, match=r"rl: missing key 'app'.*apps.pipeline.main"):
        load_config(yaml, schema=PipelineConfig)
    cfg = load_config(yaml, schema=Config)
    assert (cfg.sft.app, cfg.rl.app) == ("apps.sft.main", "apps.grpo.main")


def test_deterministic_actors_need_fixed_threads():
    from forge import actor_env_vars

    env = actor_env_vars(2, deterministic=True)
    assert env["FORGE_DETERMINISTIC"] == "1" and env["OMP_NUM_THREADS"] == "2"
    assert env["FORGE_THREAD_BUDGET"] == "0" and env["PYTHONHASHSEED"] == "0"
    with pytest.raises(ValueError, match="fixed thread count"):
        actor_env_vars(0, deterministic=True)


def test_a_pipelines_before_and_after_are_the_step_0_and_a_later_evaluation():
    """``baseline`` is the evaluation before training (step 0) and the result one after a
    step; a run that evaluated only at its end has no baseline (nan), not its result twice."""
    import math

    from forge.run.pipeline import _after, _before

    assert (_before({0: 0.2, 10: 0.5, 30: 0.7}), _after({0: 0.2, 10: 0.5, 30: 0.7})) == (0.2, 0.7)
    assert math.isnan(_before({30: 0.7})) and _after({30: 0.7}) == 0.7
    assert _before({0: 0.2}) == 0.2 and math.isnan(_after({0: 0.2}))
    assert math.isnan(_before({})) and math.isnan(_after({}))


def test_the_progress_bar_shows_the_teacher_kl_where_there_is_no_reward():
    """Pure distillation logs no reward: its bar shows the teacher's KL, not reward=0.000
    (which reads as a run that cannot learn); with rewards, both."""
    from forge.run.metric_log import progress_fields

    train = {"loss": 0.25}
    assert progress_fields({"rollout/teacher_kl": 0.1}, train) == {
        "teacher_kl": "0.100",
        "loss": "0.2500",
    }
    both = progress_fields({"rollout/reward": 0.5, "rollout/teacher_kl": 0.1}, train)
    assert both == {"reward": "0.500", "teacher_kl": "0.100", "loss": "0.2500"}
    assert progress_fields({}, train) == {"reward": "0.000", "loss": "0.2500"}
