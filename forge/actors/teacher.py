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
``score(episodes, prompts=None, top_k=0) -> list[TeacherScore]``
    For each ``Episode``: the teacher's logprob of each response token and the entropy of its
    distribution there (with ``top_k``, GKD: also its ``top_k`` likeliest ids and their
    logprobs at each position), after the episode's own prompt ids or, with ``prompts`` (one per
    episode: text or chat messages), after that privileged prompt, encoded as the generator
    encodes prompts. A replica that dies during a call is restarted by the service and the
    call re-sent to a healthy replica (``max_retries``), as for every service.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller import endpoint, threads
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

    @endpoint
    def score(
        self,
        episodes: Sequence[Episode],
        prompts: Sequence[Prompt] | None = None,
        top_k: int = 0,
    ) -> list[TeacherScore]:
        with threads.compute():  # this process's share of the host's cores
            return self.core.score(episodes, prompts, top_k)
