"""The ``Teacher`` actor: an on-policy-distillation teacher, a frozen model that scores the
student's sampled tokens in one prefill (``forge.training.teacher_policy``).

A service like the reference model, whose actor it extends (loading, precision, restarts,
``update_weights``, ``on_recover`` are the ``ReferenceModel``'s); the rollout side calls it
once per scored group (``forge.rollout.distiller.Distiller``)::

    teacher = await Teacher.options(num_replicas=2).as_service(cfg.teacher_service)
    scores = await teacher.score.route(group, prompts)    # prompts: None, or privileged ones

Endpoints, besides the ``ReferenceModel``'s (``forward``, ``update_weights``, ``version``,
``on_recover``):

``setup()``
    Run by the runtime at spawn: loads the model (a ``ReferenceConfig``).
``batching() -> {"calls": int, "batches": int}``
    How many ``score`` calls this replica took and in how many prefills it scored them.
``score(episodes, prompts=None, top_k=0) -> list[TeacherScore]``
    For each ``Episode``: the teacher's logprob of each response token and the entropy of its
    distribution there (with ``top_k``, GKD: also its ``top_k`` likeliest ids and their
    logprobs at each position), after the episode's own prompt ids or, with ``prompts`` (one per
    episode: text or chat messages), after that privileged prompt, encoded as the generator
    encodes prompts. Calls that arrive while the replica is scoring are merged into its next
    prefill (``controller.coalesce.Coalescer``): groups of one, scored concurrently, cost one
    forward of all their rows, not one each. A replica that dies during a call is restarted
    by the service and the call re-sent to a healthy replica (``max_retries``), as for every
    service.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller import endpoint, threads
from controller.coalesce import Coalescer
from forge.actors.forge_actor import use_deterministic_kernels
from forge.actors.reference_model import ReferenceModel
from forge.generation.prompts import Prompt
from forge.types import Episode, TeacherScore

__all__ = ["Teacher"]


class Teacher(ReferenceModel):
    """An OPD teacher; see the module docstring for its endpoints."""

    @endpoint
    def setup(self) -> None:
        use_deterministic_kernels()
        from forge.training.teacher_policy import TeacherCore

        self.core = TeacherCore(self.cfg)
        self.batcher = Coalescer(self._score_requests)

    @endpoint
    async def score(
        self,
        episodes: Sequence[Episode],
        prompts: Sequence[Prompt] | None = None,
        top_k: int = 0,
    ) -> list[TeacherScore]:
        episodes = list(episodes)
        if not episodes or not all(isinstance(ep, Episode) for ep in episodes):
            raise TypeError("Teacher.score takes a non-empty list of Episode")
        return await self.batcher((episodes, prompts, top_k))

    @endpoint
    def batching(self) -> dict[str, int]:
        """``{"calls": score calls taken, "batches": prefills run for them}`` since start."""
        return {"calls": self.batcher.calls, "batches": self.batcher.batches}

    def _score_requests(self, requests: list[_Request]) -> list[list[TeacherScore]]:
        """Each request's scores, from one ``score`` per kind of request (``top_k``, and
        privileged prompts or not) over all their episodes."""
        kinds: dict[tuple[int, bool], list[int]] = {}
        for i, (_, prompts, top_k) in enumerate(requests):
            kinds.setdefault((top_k, prompts is None), []).append(i)
        out: list[list[TeacherScore]] = [[] for _ in requests]
        for (top_k, plain), members in kinds.items():
            episodes = [e for i in members for e in requests[i][0]]
            prompts = None if plain else [p for i in members for p in _prompts(requests[i])]
            with threads.compute():  # this process's share of the host's cores
                scores = self.core.score(episodes, prompts, top_k)
            start = 0
            for i in members:
                n = len(requests[i][0])
                out[i], start = scores[start : start + n], start + n
        return out


_Request = tuple[list[Episode], Sequence[Prompt] | None, int]


def _prompts(request: _Request) -> list[Prompt]:
    episodes, prompts, _ = request
    assert prompts is not None
    if len(prompts) != len(episodes):
        raise ValueError(f"{len(prompts)} teacher prompts for {len(episodes)} episodes")
    return list(prompts)
