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

A replica restarted by the service layer starts from the initial weights again (version 0);
with ``ema`` its average starts over.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from controller import endpoint
from forge.actors.base import ForgeActor
from forge.training.config import ReferenceConfig
from forge.types import Episode, TrainBatch
from forge.weights import WeightHandle

__all__ = ["ReferenceModel"]


class ReferenceModel(ForgeActor):
    """The reference policy; see the module docstring for its endpoints."""

    def __init__(self, config: ReferenceConfig | dict) -> None:
        if isinstance(config, dict):
            from forge.config.schema import config_from_dict

            config = config_from_dict(ReferenceConfig, config, source="ReferenceModel(config)")
        if not isinstance(config, ReferenceConfig):
            raise TypeError(
                f"ReferenceModel takes a ReferenceConfig (or a dict of its fields), got "
                f"{type(config).__name__}"
            )
        self.cfg = config
        self.core = None

    @endpoint
    def setup(self) -> None:
        from forge.training.reference import ReferenceCore

        self.core = ReferenceCore(self.cfg)

    @endpoint
    def forward(self, batch: TrainBatch | Sequence[Episode]) -> list[list[float]] | torch.Tensor:
        return self.core.logprobs(batch)

    @endpoint
    def update_weights(self, version: int | None = None, handle: WeightHandle | None = None) -> int:
        return self.core.update_weights(version, handle)

    @endpoint
    def version(self) -> int:
        return self.core.version()
