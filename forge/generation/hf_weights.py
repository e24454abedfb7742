"""The ``"hf"`` backend's weights: updates (in place, or in a new lane while requests run),
LoRA adapters (``lora_mode``), and sleep (``placement.colocate``).

``HFWeights`` is the part of ``HFBackend`` (``hf_backend.py``, whose docstring says how
versions, lanes, adapters and sleep behave) that changes what the model computes with;
``Lane`` is one weight version's model and the requests running on it. The
plain functions at the bottom (``match_weights``, ``load_in_place``, ``rebind_weights``,
``clone_with_weights``) do the tensor work and are tested on their own.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.generation.backend import GeneratorConfig
from forge.generation.hf_engine import HFEngine
from forge.generation.sleep import drop_weights, materialize_weights
from forge.observability.memory import release_cached_memory
from forge.weights.adapter import unpack_adapter


@dataclass
class Lane:
    """One model (one weight version) and the requests running on it."""

    engine: HFEngine
    futures: dict[int, tuple[asyncio.Future, int]] = field(default_factory=dict)  # id -> (f, n)
    rows: int = 0  # samples admitted and not yet finished
    lease: Any = None  # a ShmLease when the model's weights are views of a shared file

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    @property
    def version(self) -> int:
        return self.engine.version


class HFWeights:
    """Weight updates, adapters and sleep of ``HFBackend``, which sets up the state below
    (``HFBackend.__init__``) and provides ``_new_lane``, ``_free_slots`` and the serve loop
    these methods pause or wake."""

    config: GeneratorConfig
    version: int
    _lanes: list[Lane]  # the last one admits new requests
    _wake: asyncio.Event
    _drained: asyncio.Event
    _step_lock: asyncio.Lock
    _update_lock: asyncio.Lock
    _paused: bool
    _asleep: bool
    _dropped: Any
    _needs_weights: bool
    _stats: dict[str, int]
    _lora: Any
    _slots: Any
    _adapters: dict[str, tuple[int, int]]

    # ---- weights ------------------------------------------------------------------------

    @property
    def can_share_weights(self) -> bool:
        return torch.device(self.config.device).type == "cpu"

    async def update_weights(
        self, state_dict: dict[str, torch.Tensor], version: int, mode: str
    ) -> None:
        await self._update(state_dict, None, version, mode)

    async def update_weights_shared(
        self, state_dict: dict[str, torch.Tensor], lease: Any, version: int, mode: str
    ) -> None:
        """The lane that runs ``version`` computes with ``state_dict``'s views in place and
        holds ``lease`` until it retires or moves to another version."""
        await self._update(state_dict, lease, version, mode)

    async def _update(self, state_dict, lease, version: int, mode: str) -> None:
        async with self._update_lock:
            if mode == "drain":
                self._paused = True
                try:
                    await self._drained.wait()
                    async with self._step_lock:
                        self._materialize()
                        state_dict = await self._full_weights(state_dict)
                        await self._swap_in_place(state_dict, version, lease)
                finally:
                    self._paused = False
                    self._wake.set()
            else:
                async with self._step_lock:
                    self._materialize()
                    state_dict = await self._full_weights(state_dict)
                    current = self._lanes[-1]
                    if current.futures or current.engine.has_work():
                        model = await asyncio.to_thread(
                            clone_with_weights, current.engine.model, state_dict
                        )
                        self._lanes.append(self._new_lane(model, version))
                        self._lanes[-1].lease = lease
                        self._stats["in_flight_updates"] += 1
                        n = len(self._lanes)
                        self._stats["max_lanes"] = max(self._stats["max_lanes"], n)
                    else:
                        await self._swap_in_place(state_dict, version, lease)
            self.version = version
            self._needs_weights = False
            self._stats["weight_updates"] += 1

    async def _full_weights(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A pushed LoRA adapter (``forge.weights.adapter``) as the tensors to load into the
        current model (``GeneratorConfig.lora_mode``); full weights as they are. Runs under
        the step lock: the first adapter changes the model (``forge.training.lora``)."""
        adapter = unpack_adapter(state_dict)
        if adapter is None:
            return state_dict
        if self._needs_weights:
            raise ValueError(
                "a LoRA adapter is applied to the base weights, which a level-2 sleep freed; "
                "sleep at level 1 (placement.sleep_level: 1) to keep them"
            )
        if self._slots is not None:
            raise ValueError(
                "this generator serves many adapters (lora_mode: multi): load each with "
                "load_adapter(name, handle), not update_weights"
            )
        from forge.training.lora import LoraApplier

        spec, tensors = adapter
        if spec.base_model != self.config.model:  # both are the policy's model, as configured
            raise ValueError(
                f"the pushed LoRA adapter is for base model {spec.base_model!r}, but this "
                f"generator serves {self.config.model!r}; give both roles the policy's model"
            )
        if self._lora is None:
            self._lora = LoraApplier(self.config.lora_mode)
        model = self._lanes[-1].engine.model
        return await asyncio.to_thread(self._lora.state_dict_for, model, spec, tensors)

    async def update_weights_from(self, pull, version: int, mode: str) -> None:
        """Idle replica (the common case between RL steps): pull straight into the model's
        tensors under the step lock (no decode step runs meanwhile): one copy, no staging."""
        async with self._update_lock, self._step_lock:
            self._materialize()
            current = self._lanes[-1]
            idle = not (current.futures or current.engine.has_work())
            # (A model computing with shared read-only views cannot be copied into.)
            if idle and mode == "in_flight" and current.lease is None:
                model = current.engine.model
                current.engine.clear_prefix_cache()  # its KV belongs to the old weights
                await asyncio.to_thread(pull, dict(model.state_dict()))
                current.engine.version = version
                self.version = version
                self._needs_weights = False
                self._stats["weight_updates"] += 1
                return
        state_dict = await asyncio.to_thread(pull, None)
        await self.update_weights(state_dict, version, mode)

    async def _swap_in_place(
        self, state_dict: dict[str, torch.Tensor], version: int, lease: Any = None
    ) -> None:
        current = self._lanes[-1]
        current.engine.clear_prefix_cache()  # its KV belongs to the old weights
        model = current.engine.model
        if lease is not None or current.lease is not None:
            # Shared weights are read-only: point the model at the new tensors instead of
            # copying into the old ones (owned copies when the new ones are not leased).
            await asyncio.to_thread(rebind_weights, model, state_dict, lease is None)
        else:
            await asyncio.to_thread(load_in_place, model, state_dict)
        current.release()
        current.lease = lease
        # HFEngine stamps new requests with ``engine.version`` (its documented contract).
        current.engine.version = version

    def named_weights(self) -> dict[str, torch.Tensor]:
        if self._dropped is not None:  # asleep at level 2: what an update must bring (meta)
            return {
                name: torch.empty(shape, dtype=dtype, device="meta")
                for name, (shape, dtype, _) in self._dropped.specs.items()
            }
        return dict(self._lanes[-1].engine.model.state_dict())

    # ---- adapters (lora_mode: multi) ---------------------------------------------------

    async def load_adapter(
        self, name: str, version: int, state_dict: dict[str, torch.Tensor]
    ) -> None:
        """``lora_mode: multi``: load a pushed adapter version as ``name`` into a slot of its
        own; requests admitted from then on use it, running ones keep the version they
        started with (``forge.generation.multi_lora``)."""
        if self._slots is None:
            raise ValueError(
                "load_adapter needs lora_mode: multi (this generator has "
                f"lora_mode {self.config.lora_mode!r})"
            )
        adapter = unpack_adapter(state_dict)
        if adapter is None:
            raise ValueError(f"load_adapter({name!r}): the pushed version holds no LoRA adapter")
        spec, tensors = adapter
        if spec.base_model != self.config.model:
            raise ValueError(
                f"adapter {name!r} is for base model {spec.base_model!r}, but this generator "
                f"serves {self.config.model!r}"
            )
        old = self._adapters.get(name)
        if old is not None and version <= old[1]:
            raise ValueError(
                f"adapter {name!r}: version {version} is not newer than the loaded {old[1]}"
            )
        async with self._step_lock:
            slot = await asyncio.to_thread(self._slots.load, spec, tensors)
            self._adapters[name] = (slot, version)
            self._free_slots()
        self._stats["weight_updates"] += 1

    # ---- sleep (placement.colocate) -----------------------------------------------------

    async def sleep(self, level: int) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 (KV cache) or 2 (also weights), got {level!r}")
        async with self._update_lock:
            self._asleep = True  # admit nothing more; running requests finish first
            await self._drained.wait()
            async with self._step_lock:
                current = self._lanes[-1]
                for lane in self._lanes[:-1]:  # older versions' lanes are idle once drained
                    lane.release()
                self._lanes = [current]
                current.engine.clear_prefix_cache()  # the KV kept for next turns
                if level == 2 and self._dropped is None:
                    self._dropped = drop_weights(current.engine.model)
                    current.release()  # (shared read-only views: the file may go now)
                self._stats["sleeps"] += 1
        await asyncio.to_thread(release_cached_memory)

    async def wake(self) -> None:
        async with self._update_lock:
            if not self._asleep:
                return
            if self._dropped is not None or self._needs_weights:
                raise RuntimeError(
                    "wake(): this generator slept at level 2 (its weights were freed) and no "
                    "weight update has loaded new ones since; update_weights first (a push "
                    "while asleep materialises them), or sleep at level 1"
                )
            self._asleep = False
            self._stats["wakes"] += 1
        self._wake.set()

    def _materialize(self) -> None:
        """Before a weight update (under the step lock): storage for dropped weights."""
        if self._dropped is not None:
            materialize_weights(self._lanes[-1].engine.model, self._dropped)
            self._dropped, self._needs_weights = None, True


def match_weights(
    model: torch.nn.Module, state_dict: dict[str, torch.Tensor]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Pair each model tensor (parameter or persistent buffer) with its pushed tensor.

    Returns ``name -> (model tensor, pushed tensor cast to its dtype and device)``. Raises
    ``ValueError`` for a pushed name the model lacks, a shape mismatch, or a model tensor
    that nothing pushed covers (a tied alias such as ``lm_head.weight`` is covered by
    ``model.embed_tokens.weight``).
    """
    own = model.state_dict(keep_vars=True)
    extra = sorted(set(state_dict) - set(own))
    if extra:
        raise ValueError(
            f"pushed weights have {len(extra)} name(s) the generator's model lacks, e.g. "
            f"{extra[:3]}; trainer and generator must load the same architecture (HF names)"
        )
    covered = {id(own[name]) for name in state_dict}
    stale = sorted(name for name, t in own.items() if id(t) not in covered)
    if stale:
        raise ValueError(
            f"pushed weights miss {len(stale)} of the model's tensors, e.g. {stale[:3]}; "
            "they would keep stale values. Push the whole state dict"
        )
    pairs = {}
    for name, src in state_dict.items():
        dst = own[name]
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(
                f"pushed weight {name!r} has shape {list(src.shape)} but the generator's is "
                f"{list(dst.shape)}"
            )
        pairs[name] = (dst, src.to(device=dst.device, dtype=dst.dtype))
    return pairs


@torch.no_grad()
def load_in_place(model: torch.nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy ``state_dict`` into ``model``'s tensors (checked by ``match_weights``)."""
    for dst, src in match_weights(model, state_dict).values():
        if dst.data_ptr() != src.data_ptr():  # (a LoRA update passes most tensors as they are)
            dst.copy_(src)


@torch.no_grad()
def rebind_weights(
    model: torch.nn.Module, state_dict: dict[str, torch.Tensor], owned: bool = False
) -> None:
    """Make ``model``'s tensors *be* the pushed ones (``owned``: copies of them); the model's
    old tensors are let go, tied parameters stay tied (one Parameter object)."""
    for dst, src in match_weights(model, state_dict).values():
        dst.data = src.clone() if owned else src


def clone_with_weights(
    model: torch.nn.Module, state_dict: dict[str, torch.Tensor]
) -> torch.nn.Module:
    """A copy of ``model`` whose tensors *are* the pushed ones (the old weights are not copied).

    ``deepcopy`` consults its memo before copying anything, so pre-mapping every parameter
    and persistent buffer to its new tensor makes the copy reuse them; tied parameters map
    through one entry and stay tied. Only non-persistent buffers (rotary tables) are copied.
    """
    memo: dict[int, Any] = {}
    for dst, src in match_weights(model, state_dict).values():
        if id(dst) in memo:
            continue
        if isinstance(dst, torch.nn.Parameter):
            memo[id(dst)] = torch.nn.Parameter(src, requires_grad=dst.requires_grad)
        else:
            memo[id(dst)] = src
    return copy.deepcopy(model, memo)
