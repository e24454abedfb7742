"""The run's teacher services (on-policy distillation): one ``Teacher`` service per teacher
of an ``RLConfig``'s ``teacher:`` section.

    teachers = await spawn_teachers(cfg, env_vars)       # a Teachers, by name
    Distiller(cfg.teacher, teachers, log)                # routes each group to its teacher
"""

from __future__ import annotations

import asyncio
from typing import Any

from forge.rollout.distiller import Teachers
from forge.run.teacher_checks import teacher_reference

__all__ = ["spawn_teachers"]


async def spawn_teachers(cfg: Any, env_vars: dict[str, str]) -> Teachers:
    """Start one ``Teacher`` service per teacher of ``cfg.teacher`` (an ``RLConfig``'s), each
    with its own ``replicas`` or ``replicas.teacher``, in parallel."""
    from forge.actors.teacher import Teacher

    named = cfg.teacher.teachers()
    services = await asyncio.gather(
        *(
            Teacher.options(
                num_replicas=t.replicas or cfg.replicas.teacher, env_vars=env_vars
            ).as_service(teacher_reference(cfg, t))
            for t in named.values()
        )
    )
    return Teachers(dict(zip(named, services)))
