"""The RewardModel actor as a service of real processes, checked against the in-process core."""

from __future__ import annotations

import pytest

from controller import ActorError
from forge.actors.reward_model import RewardModel
from forge.models.reward_model import RewardModelConfig, RewardModelCore, make_tiny_reward_model
from forge.observability import merge_states
from forge.rewards import RewardResult

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


@pytest.mark.slow  # 10-18 s: slow tier, to keep the fast tier under 6 minutes
async def test_service_scores_match_the_in_process_core(rm_dir):
    cfg = RewardModelConfig(model=rm_dir, device="cpu", micro_batch_size=2, name="rm")
    expected = RewardModelCore(cfg).score(PAIRS)
    svc = await RewardModel.options(num_replicas=2).as_service(cfg)
    try:
        results = await svc.evaluate_batch.route(ITEMS)
        assert all(isinstance(r, RewardResult) for r in results)
        assert [r.total for r in results] == pytest.approx(expected, abs=1e-5)
        assert [list(r.components) for r in results] == [["rm"]] * len(ITEMS)
        assert [r.components["rm"] for r in results] == [r.total for r in results]

        per_replica = await svc.score.fanout(PAIRS)
        assert len(per_replica) == 2
        for scores in per_replica:
            assert scores == pytest.approx(expected, abs=1e-5)

        merged = merge_states(await svc.flush_metrics.fanout())
        assert merged["reward_model/pairs"] == 3 * len(PAIRS)  # route once, fanout twice
        assert merged["reward_model/score"] == pytest.approx(sum(expected) / len(expected))

        with pytest.raises(ActorError, match="pair 0 has an empty prompt and response"):
            await svc.score.route([("", "")])
        with pytest.raises(ActorError, match="item 0 is .*\\(prompt, response, target\\)"):
            await svc.evaluate_batch.route([("prompt", "response")])
        # still serving after user errors
        assert await svc.score.route(PAIRS[:1]) == pytest.approx(expected[:1], abs=1e-5)
    finally:
        await svc.shutdown()


def test_actor_takes_a_config_or_a_dict_of_its_fields(rm_dir):
    # The constructor alone, in process: spawning adds nothing here but seconds.
    assert RewardModel({"model": rm_dir, "name": "rm"}).cfg == RewardModelConfig(rm_dir, name="rm")
    with pytest.raises(TypeError, match="takes a RewardModelConfig .*got str"):
        RewardModel(rm_dir)
    with pytest.raises(ValueError, match="unknown key 'modle'"):
        RewardModel({"modle": rm_dir})
