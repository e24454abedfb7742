"""Generator: samples completions from the policy, with versioned weights (run as a service).

Endpoints (all ``async``: they run on the actor's event loop, so concurrent calls overlap and
``generate`` calls are batched together by the backend):

- ``setup()``: runs at spawn. Builds the backend named by ``GeneratorConfig.backend``, loads
  the model and tokenizer, starts serving. A missing model -> ``ActorError`` from
  ``as_actor``/``as_service`` (an unknown backend already fails in ``GeneratorConfig``).
- ``generate(prompt, **sampling) -> list[Completion]``: called by rollout loops with
  ``route`` (service) or ``call_one``. ``prompt`` is a string or chat messages; keywords
  override ``GeneratorConfig.sampling`` (``n``, ``max_tokens``, ``temperature``, ``top_p``,
  ``top_k``, ``stop``, ``seed``, ``logprobs``); an unknown keyword is a ``TypeError``.
- ``update_weights(version=None, handle=None, mode=None) -> int``: called by the training loop
  (``call``/fanout to every replica) after the trainer pushed a version. Pulls ``handle`` (a
  ``forge.weights.WeightHandle``) or the version by number from the configured transport
  (``None``: the latest there), swaps it in and returns the version now in use. ``mode``:
  ``"in_flight"`` (default) or ``"drain"``; see ``forge.generation.hf_backend``. With
  ``weights.share`` (default) an hf replica on CPU given a shm handle computes with the
  pushed file in place (``forge.weights.lease_shm_file``): no copy, one copy per host. A
  version that holds a LoRA adapter (``WeightHandle.is_adapter``, a trainer with ``lora``)
  is pulled (a few KB to MBs) and applied to the base the replica holds
  (``GeneratorConfig.lora_mode``, see ``forge.generation.hf_backend``).
- ``prompt_topk_logprobs(token_ids, k, adapter=None)``: ``prompt_logprobs`` plus each
  position's ``k`` most likely tokens and their logprobs (``forge serve``, hf backend).
- ``load_adapter(name, handle) -> int`` (``lora_mode: multi``, hf backend): serve the pushed
  adapter version as ``name`` next to the other adapters on the one base model (per-row
  LoRA, ``forge.generation.multi_lora``); ``generate(prompt, adapter=name, ...)`` samples
  with its newest version and stamps completions with ``adapter`` and that version.
- ``on_recover() -> int``: called by the service layer after it restarted a crashed replica,
  before the replica takes traffic: loads the latest version published where the config
  says, by default the run's publication location (``forge.weights.pull``), if any (else
  keeps the initial weights, version 0). It logs the version (logger ``forge.generator``).
  The first ``generate`` calls after it load any newer version pushed meanwhile (the app's
  ``update_weights`` fanout skipped the restarting replica), and the replica logs the version
  stamped on its first completions.
- ``sleep(level=2) -> dict`` / ``wake() -> dict``: time-sliced colocation
  (``placement.colocate``, driven by ``forge.run.colocate``, fanned out to every replica):
  ``sleep`` holds new requests, lets running ones finish and frees the KV cache (level 2:
  the weights too; the next ``update_weights`` brings new ones); ``wake`` serves the held
  requests again (a no-op on an awake replica, e.g. one restarted meanwhile). Both return
  ``memory()`` afterwards. ``memory() -> dict``: this process's host RSS and GPU memory
  (``forge.observability.memory``).
- ``get_version() -> int``; ``stats() -> dict`` (batch sizes, counts, lanes);
  ``state_dict_checksum() -> str`` and ``get_param(name) -> Tensor`` for weight-sync checks.

Versions only move forward: updating to the version in use is a no-op, to an older one a
``ValueError`` (except, on a restarted replica, a version no newer than the one its recovery
loaded by itself: the app's update may arrive after it; that is a no-op).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from controller import endpoint
from forge.actors.forge_actor import MODEL_PRELOAD, ForgeActor, use_deterministic_kernels
from forge.generation.backend import (
    UPDATE_MODES,
    GeneratorBackend,
    GeneratorConfig,
    state_dict_checksum,
)
from forge.generation.factory import build_generator_backend
from forge.generation.prompts import Prompt, make_sampling_params
from forge.observability.memory import memory_snapshot
from forge.types import Completion
from forge.weights import WeightHandle, build_transport, lease_shm_file, pull_handle
from forge.weights.pull import latest_pushed_version, requested_version
from forge.weights.relay import localize, recall_latest

logger = logging.getLogger("forge.generator")


class Generator(ForgeActor):
    """One generator replica: ``Generator.options(procs=1).as_actor(GeneratorConfig(...))``,
    or ``as_service`` for several. The module docstring details each endpoint: rollout loops
    call ``generate`` (``route`` on a service, ``call_one`` on an actor); the weight sync
    calls ``update_weights`` on every replica after the trainer pushes; the service layer
    calls ``on_recover`` on a restarted replica; ``get_version``, ``stats``,
    ``state_dict_checksum`` and ``get_param`` are for metrics and checks."""

    preload = MODEL_PRELOAD

    _busy_name = "generator"

    def __init__(self, config: GeneratorConfig) -> None:
        if not isinstance(config, GeneratorConfig):
            raise TypeError(
                f"Generator takes a GeneratorConfig, got {type(config).__name__}; build one "
                "with GeneratorConfig(model=...) or forge.config.config_from_dict"
            )
        self.config = config
        self.backend: GeneratorBackend | None = None
        self._transport = None
        self._recovered = False  # set by on_recover; cleared once the first call is served
        self._catch_up: asyncio.Future | None = None  # first calls after recovery wait on it
        # The newest version a recovery loaded by itself: the app may still send older ones.
        self._recovered_version: int | None = None

    @classmethod
    def service_defaults(cls, config: Any = None, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """As many requests in flight per replica as its batch has rows: a replica batches
        rows itself (up to ``max_batch_size``), and the services' default cap of 10 would hold
        one-sample requests (each turn of a multi-turn episode) to batches of 10. Measured on
        the calculator demo (multi-turn, 2 cores): 40 GRPO steps in 83 s at the cap of 10,
        32 s at 128."""
        size = getattr(config, "max_batch_size", None)
        if isinstance(size, int) and not isinstance(size, bool) and size > 10:
            return {"replica_max_concurrent_requests": size}
        return {}

    @endpoint
    async def setup(self) -> None:
        use_deterministic_kernels()
        backend = build_generator_backend(self.config)
        await backend.start()
        self.backend = backend

    # ---- generation -------------------------------------------------------------------

    @endpoint
    async def generate(
        self, prompt: Prompt, adapter: str | None = None, **sampling: Any
    ) -> list[Completion]:
        params = make_sampling_params(self.config.sampling, sampling)
        if adapter is not None:  # lora_mode multi: sample with that adapter's newest version
            with self.busy():
                return await self._backend().generate(prompt, params, adapter=adapter)
        if self._recovered:
            # A version pushed while this replica was restarting missed it (the app's fanout
            # went to healthy replicas only): catch up before serving the first requests.
            if self._catch_up is None:
                self._catch_up = asyncio.ensure_future(self._load_latest())
                self._catch_up.add_done_callback(self._forget_failed_catch_up)
            # Shielded: a caller that gives up (timeout, failover) must not cancel the load
            # the other first callers wait on.
            await asyncio.shield(self._catch_up)
        with self.busy():
            out = await self._backend().generate(prompt, params)
        if self._recovered and out:
            self._recovered = False
            logger.warning(
                "generator %s (pid %d): first completions after recovery at weight version %d",
                self._forge_name,
                os.getpid(),
                out[0].generator_version,
            )
        return out

    # ---- weights ----------------------------------------------------------------------

    @endpoint
    async def update_weights(
        self,
        version: int | None = None,
        handle: WeightHandle | None = None,
        mode: str | None = None,
    ) -> int:
        backend = self._backend()
        mode = mode or self.config.update_mode
        if mode not in UPDATE_MODES:
            raise ValueError(
                f"update_weights mode {mode!r} is unknown; choose one of {UPDATE_MODES}"
            )
        version = requested_version(version, handle, self._latest_pushed)
        broadcast = handle is not None and handle.transport == "broadcast"
        if version == backend.version and not broadcast:  # (a broadcast's sender waits for us)
            return version
        if version < backend.version and self._recovered_version is not None:
            if version <= self._recovered_version:
                return backend.version  # a restarted replica loaded a newer one by itself
        if version < backend.version:
            raise ValueError(
                f"weight version {version} is older than the version in use "
                f"({backend.version}); versions only move forward"
            )
        if handle is not None:
            handle = await localize(handle)  # pushed on another host: copy it here first
        if handle is not None and self._matches_model(handle):
            if self._can_share(handle):
                views, lease = await asyncio.to_thread(
                    lease_shm_file, handle.location, handle.version, handle.manifest
                )
                try:
                    await backend.update_weights_shared(views, lease, version, mode)
                except BaseException:
                    lease.release()
                    raise
                return version

            def pull(into):
                return pull_handle(handle, into=into)

            await backend.update_weights_from(pull, version, mode)
            return version
        if handle is not None:
            state_dict = await asyncio.to_thread(pull_handle, handle)
        else:
            state_dict = await asyncio.to_thread(self._transport_or_raise().pull, version)
        await backend.update_weights(state_dict, version, mode)
        return version

    def _can_share(self, handle: WeightHandle) -> bool:
        """Whether to compute with ``handle``'s shm file in place (``weights.share``)."""
        return (
            self.config.weights.share
            and handle.transport == "shm"
            and self._backend().can_share_weights
        )

    def _matches_model(self, handle: WeightHandle) -> bool:
        """Whether the pushed tensors can be read straight into this replica's model: same
        names, dtypes and shapes (else the backend's checked, casting load is used)."""
        try:
            named = self._backend().named_weights()
        except NotImplementedError:
            return False
        if set(named) != set(handle.manifest):
            return False
        for name, meta in handle.manifest.items():
            t = named[name]
            if str(t.dtype).removeprefix("torch.") != meta.dtype or tuple(t.shape) != tuple(
                meta.shape
            ):
                return False
        return True

    @endpoint
    async def prompt_logprobs(
        self, token_ids: list[int], adapter: str | None = None
    ) -> list[float]:
        """Each prompt token's logprob given the tokens before it (NaN for the first), at the
        current weights (``adapter``'s under ``lora_mode: multi``); hf backend."""
        backend = self._backend()
        if not hasattr(backend, "prompt_logprobs"):
            raise NotImplementedError(f"{type(backend).__name__} has no prompt logprobs")
        with self.busy():
            return await backend.prompt_logprobs(token_ids, adapter)

    @endpoint
    async def prompt_topk_logprobs(
        self, token_ids: list[int], k: int, adapter: str | None = None
    ) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """``prompt_logprobs`` and, at each position after the first, the ``k`` most likely
        tokens and their logprobs (``forge serve``'s ``topk_prompt_logprobs``); hf backend."""
        backend = self._backend()
        if not hasattr(backend, "prompt_topk_logprobs"):
            raise NotImplementedError(f"{type(backend).__name__} has no top-k prompt logprobs")
        with self.busy():
            return await backend.prompt_topk_logprobs(token_ids, k, adapter)

    @endpoint
    async def load_adapter(self, name: str, handle: WeightHandle) -> int:
        """``lora_mode: multi``: pull the adapter version ``handle`` points to and serve it as
        ``name`` (``generate(..., adapter=name)``) next to the others, on the one base model
        this replica holds. Returns the version."""
        handle = await localize(handle)
        state_dict = await asyncio.to_thread(pull_handle, handle)
        await self._backend().load_adapter(name, handle.version, state_dict)
        return handle.version

    @endpoint
    async def on_recover(self) -> int:
        t0 = time.perf_counter()
        version = await self._load_latest()
        self._recovered, self._catch_up = True, None
        logger.warning(
            "generator %s (pid %d) recovered: serving weight version %d (loaded in %.2f s)",
            self._forge_name,
            os.getpid(),
            version,
            time.perf_counter() - t0,
        )
        return version

    def _forget_failed_catch_up(self, fut: asyncio.Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._catch_up = None  # the next request tries again

    async def _load_latest(self) -> int:
        before = self._backend().version
        transport = self._transport_or_raise()
        handle = None
        if not transport.versions():  # another host than the trainer's: ask the controller
            handle = await recall_latest(getattr(transport, "prefix", ""))
        if handle is not None or transport.versions():
            version = await self.update_weights(handle=handle)
            if version > before:
                self._recovered_version = version
        return self._backend().version

    # ---- sleep (placement.colocate) ---------------------------------------------------

    @endpoint
    async def sleep(self, level: int = 2) -> dict[str, float]:
        """Free the KV cache (and at level 2 the weights) until ``wake``; see the module."""
        await self._backend().sleep(level)
        return memory_snapshot()

    @endpoint
    async def wake(self) -> dict[str, float]:
        """Serve again after ``sleep``; a no-op when awake."""
        await self._backend().wake()
        return memory_snapshot()

    @endpoint
    async def memory(self) -> dict[str, float]:
        """This process's memory (MiB): host RSS, and GPU allocated/reserved/peak."""
        return memory_snapshot()

    @endpoint
    async def get_version(self) -> int:
        return self._backend().version

    @endpoint
    async def stats(self) -> dict[str, Any]:
        return self._backend().stats()

    @endpoint
    async def state_dict_checksum(self) -> str:
        return await asyncio.to_thread(state_dict_checksum, self._backend().named_weights())

    @endpoint
    async def get_param(self, name: str):
        weights = self._backend().named_weights()
        if name not in weights:
            raise KeyError(f"the generator's model has no parameter {name!r}")
        return weights[name].detach().to("cpu").clone()

    # ---- helpers ----------------------------------------------------------------------

    def _backend(self) -> GeneratorBackend:
        if self.backend is None:
            raise RuntimeError("the generator is not set up; setup() runs at spawn")
        return self.backend

    def _transport_or_raise(self):
        if self._transport is None:
            self._transport = build_transport(self.config.weights)
        return self._transport

    def _latest_pushed(self) -> int:
        return latest_pushed_version(self._transport_or_raise())
