"""The ``ReferenceModel`` actor: the frozen reference policy, for the KL term of the loss.

Usually a service (replicas behind a router), called once per batch of scored episodes::

    ref = await ReferenceModel.options(num_replicas=2).as_service(ReferenceConfig(model=path))
    for ep, lps in zip(episodes, await ref.forward.route(episodes)):
        ep.ref_logprobs = lps                     # collate_episodes -> ref_logprobs_bt

or as a plain actor (``as_actor``, ``call_one``). No gradients, eval mode.

Endpoints:

``setup()``
    Run by the runtime at spawn: loads the model (``ReferenceConfig``).
``forward(batch) -> list[list[float]] | Tensor``
    For a list of ``Episode``: one list per episode, the logprobs of its response tokens
    (the layout of ``Episode.ref_logprobs``). For a ``TrainBatch``: a ``[B, T]`` float32
    tensor aligned with ``input_ids_bt`` (the layout of ``TrainBatch.ref_logprobs_bt``).
    Computed like the trainer's logprobs (``forge.models.token_logprobs`` at
    ``ReferenceConfig.temperature``, which must equal the trainer's and generator's).
``update_weights(version=None, handle=None) -> int``
    Called by the training loop after the trainer pushed a version, like the generator's
    (``fanout`` to every replica, so all of them move together)::

        handle = (await trainer.push_weights.call(version)).item(procs=0)
        await ref.update_weights.fanout(version, handle)

    Applies ``ReferenceConfig.update`` (``none``: nothing, always legal to call; ``ema``;
    ``reset``; see ``forge.training.reference_update``) and returns the policy version the
    reference last applied. Versions only move forward; a version the rule skips (``every``)
    is recorded without pulling anything.
``version() -> int``
    The policy version the reference last applied (0: the initial weights).
``on_recover() -> int``
    Called by the service layer after it restarted a crashed replica, before the replica
    takes traffic. With ``update.type="reset"`` the reference reloads the newest published
    version the rule resets at (from ``ReferenceConfig.weights``, by default the run's
    publication location, ``forge.weights.pull``), so it matches its healthy peers as long
    as that version is still kept (``keep_last``). With ``none`` nothing changes; with
    ``ema`` (and user rules) the replica starts from the initial weights and its average
    starts over. Returns the version applied.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

from controller import endpoint, files, threads
from forge.actors.forge_actor import (
    MODEL_PRELOAD,
    ForgeActor,
    actor_config,
    use_deterministic_kernels,
)
from forge.training.trainer_config import ReferenceConfig
from forge.types import Episode, TrainBatch
from forge.weights import WeightHandle

__all__ = ["ReferenceModel"]

logger = logging.getLogger("forge.reference")


class ReferenceModel(ForgeActor):
    """The reference policy; see the module docstring for its endpoints."""

    preload = MODEL_PRELOAD

    def __init__(self, config: ReferenceConfig | dict) -> None:
        self.cfg = actor_config(ReferenceConfig, config, "ReferenceModel")
        self.core = None

    @endpoint
    def setup(self) -> None:
        use_deterministic_kernels()
        from forge.training.reference_policy import ReferenceCore

        self.core = ReferenceCore(self.cfg)

    @endpoint
    def forward(self, batch: TrainBatch | Sequence[Episode]) -> list[list[float]] | torch.Tensor:
        with threads.compute():  # this process's share of the host's cores
            return self.core.logprobs(batch)

    @endpoint
    def update_weights(self, version: int | None = None, handle: WeightHandle | None = None) -> int:
        return self.core.update_weights(version, handle)

    @endpoint
    def version(self) -> int:
        return self.core.version()

    @endpoint
    def on_recover(self) -> int:
        from forge.training.reference_update import should_update

        rule, core = self.cfg.update, self.core
        if rule.type != "reset":
            return core.version()
        versions = core._transport_or_raise().versions()
        if not versions and files.remote():
            logger.warning(
                "reference %s restarted on a host without the trainer's weight files: its "
                "'reset' rule cannot find the last reset version here, so it keeps its current "
                "weights until the next reset (known gap across hosts; docs/multihost.md)",
                self._forge_name,
            )
        resets = [v for v in versions if should_update(rule, v)]
        if resets:
            core.update_weights(resets[-1])
        if versions:
            core.seen_version = max(core.seen_version, versions[-1])
        logger.warning(
            "reference %s (pid %d) recovered: reference at policy version %d",
            self._forge_name,
            os.getpid(),
            core.version(),
        )
        return core.version()
