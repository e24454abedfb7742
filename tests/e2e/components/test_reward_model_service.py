"""The RewardModel actor as a service of two replicas, checked against the in-process core
(10-18 s; the constructor's checks are tests/unit/test_reward_model_actor.py)."""

from __future__ import annotations

import pytest

from controller import ActorError
from forge.actors.reward_model import RewardModel
from forge.models.reward_classifier import (
    RewardModelConfig,
    RewardModelCore,
    make_tiny_reward_model,
)
from forge.observability import merge_states
from forge.rewards import RewardResult
from tests.unit.test_reward_model_actor import ITEMS, PAIRS


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    return str(make_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", preset="tiny"))


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
