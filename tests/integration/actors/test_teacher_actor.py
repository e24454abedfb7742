"""The OPD ``Teacher`` service in real processes: it scores responses like its core does, with
and without a privileged prompt, and a replica that dies (between calls, or during one) is
restarted and scores again (the call in flight retried); concurrent calls are scored in shared
prefills, each caller getting what scoring it alone gives."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from forge.actors.teacher import Teacher
from forge.training.teacher_policy import TeacherCore
from forge.training.trainer_config import ReferenceConfig
from forge.types import Episode, TeacherScore


def _flat(scores: list[TeacherScore]) -> list[float]:
    return [x for s in scores for x in s.logprobs]


def _episodes() -> list[Episode]:
    return [
        Episode("a", [5, 6, 7], [10, 11, 12], [0.0] * 3, 0.0, 0),
        Episode("b", [5], [20], [0.0], 0.0, 0),
    ]


async def test_a_teacher_replica_that_dies_is_restarted_and_scores_again(tiny_model):
    cfg = ReferenceConfig(model=tiny_model, device="cpu")
    want = TeacherCore(cfg).score(_episodes())
    teacher = await Teacher.options(num_replicas=1).as_service(cfg)
    first = await teacher.score.route(_episodes())
    assert _flat(first) == pytest.approx(_flat(want), abs=1e-5)
    privileged = await teacher.score.route(_episodes(), ["hint: 7", "hint: 8"])
    assert len(privileged[0].logprobs) == 3 and privileged[0].logprobs != first[0].logprobs
    (pid,) = teacher.metrics()[0]["pids"]
    os.kill(pid, signal.SIGKILL)
    again = await teacher.score.route(_episodes())  # waits for the restarted replica
    assert _flat(again) == pytest.approx(_flat(first), abs=1e-5)
    assert teacher.metrics()[0]["pids"] != [pid]


async def test_a_teacher_that_dies_during_a_call_is_restarted_and_the_call_retried(
    tiny_model, tmp_path
):
    from tests.integration.actors.teacher_actors import DiesOnceTeacher

    cfg = ReferenceConfig(model=tiny_model, device="cpu")
    want = TeacherCore(cfg).score(_episodes(), top_k=2)
    marker = tmp_path / "died"
    teacher = await DiesOnceTeacher.options(num_replicas=1).as_service(cfg, str(marker))
    (pid,) = teacher.metrics()[0]["pids"]
    got = await teacher.score.route(_episodes(), None, 2)  # dies in it; retried after restart
    assert marker.read_text() == str(pid)  # the first attempt ran, and died, in that replica
    assert _flat(got) == pytest.approx(_flat(want), abs=1e-5)
    assert got[0].topk_ids == want[0].topk_ids
    assert teacher.metrics()[0]["pids"] != [pid]


async def test_concurrent_calls_share_prefills_and_each_gets_its_own_scores(tiny_model):
    cfg = ReferenceConfig(model=tiny_model, device="cpu")
    core = TeacherCore(cfg)

    def episode(i: int) -> Episode:
        response = [10 + i, 11, 12][: 1 + i % 3]  # rows of different lengths
        return Episode(f"e{i}", [5, 6 + i % 3], response, [0.0] * len(response), 0.0, 0)

    # Kinds mixed: privileged prompts or not, top-k or not.
    calls = [
        ([episode(i)], None if i % 2 else [f"hint: {i}"], 3 if i % 3 == 0 else 0) for i in range(12)
    ]
    want = [core.score(*call) for call in calls]  # one at a time
    teacher = await Teacher.options(num_replicas=1).as_service(cfg)
    got = await asyncio.wait_for(asyncio.gather(*(teacher.score.route(*c) for c in calls)), 60)
    for g, w in zip(got, want, strict=True):
        assert _flat(g) == pytest.approx(_flat(w), abs=1e-5)
        assert [x for s in g for x in s.entropy] == pytest.approx(
            [x for s in w for x in s.entropy], abs=1e-4
        )
        assert g[0].topk_ids == w[0].topk_ids
    (stats,) = await teacher.batching.fanout()
    assert stats["calls"] == 12 and stats["batches"] < 12
