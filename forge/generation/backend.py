"""The Generator actor's pluggable engine: its config and the backend base class.

A backend turns ``(prompt, SamplingParams)`` into ``Completion`` lists on one model whose
weights carry an integer version, and swaps in new weights on request. The actor
(``forge.actors.generator``) owns transport and version bookkeeping; a backend only sees
state dicts. Implementations live in sibling files, import this one (never the other way
round) and are chosen by ``GeneratorConfig.backend`` through
``forge.generation.factory.build_generator_backend``; prompt encoding and sampling
parameters are ``forge.generation.prompts``:

- ``"hf"`` (``hf_backend.py``): plain transformers + ``HFEngine``, continuous batching on an
  asyncio task. Runs anywhere torch runs; what the tests and laptop runs use.
- ``"vllm"`` (``vllm_backend.py``): ``vllm.LLM`` in the actor process (needs ``forge[vllm]``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from forge.generation.prompts import Prompt
from forge.models.precision import resolve_auto, warn_if_slow_bf16
from forge.types import Completion, SamplingParams
from forge.weights.adapter import LORA_MODES
from forge.weights.transport_config import WeightTransportConfig

__all__ = [
    "BACKENDS",
    "BACKEND_KNOBS",
    "UPDATE_MODES",
    "GeneratorBackend",
    "GeneratorConfig",
    "state_dict_checksum",
]

BACKENDS = ("hf", "vllm")
UPDATE_MODES = ("in_flight", "drain")
# The GeneratorConfig fields only one backend reads; setting one for the other backend is an
# error (it would be silently ignored).
BACKEND_KNOBS: dict[str, tuple[str, ...]] = {
    "hf": ("device", "attn_implementation", "prefix_cache_tokens", "lora_mode"),
    "vllm": ("engine_kwargs",),
}


@dataclass
class GeneratorConfig:
    """Everything a Generator replica needs to start. A knob only the other backend reads
    (``BACKEND_KNOBS``) set to a non-default value is a ``ValueError``."""

    model: str
    """Local HF model directory or hub id (in a run: the policy's)."""
    backend: Literal["hf", "vllm"] = "hf"
    """``hf`` (transformers + Forge's continuous batching, runs anywhere torch runs) or
    ``vllm`` (needs ``forge[vllm]``)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """The model's dtype; ``auto``: ``bfloat16`` where the device multiplies bf16 natively
    (``forge.models.precision``), else ``float32``, decided by each replica on its own
    device when it starts (``with_precision``); pushed weights of another type are cast to
    it on load."""
    device: str = "cpu"
    """hf backend: the torch device (``cpu``, ``cuda``, ``cuda:1``)."""
    max_batch_size: int = 32
    """Most sequences (samples, not requests) decoded together."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Defaults for every ``generate`` call; keyword overrides replace fields."""
    seed: int = 0
    """Seeds the sampling streams of requests that give no ``seed`` (in a run: the run's)."""
    update_mode: Literal["in_flight", "drain"] = "in_flight"
    """Default for ``update_weights``: ``in_flight`` (no drain; hf: running requests finish
    on the weights they started with, in a second lane; vllm: they continue on the new
    weights, see ``vllm_backend``) or ``drain`` (wait until idle, then swap)."""
    attn_implementation: str = "eager"
    """hf backend attention: ``eager`` matches the trainer's logprob recomputation
    bit-for-bit on CPU; ``sdpa`` is faster on GPUs."""
    weights: WeightTransportConfig = field(default_factory=WeightTransportConfig)
    """Where versions are pulled from by number (in a run: the run's ``weights``)."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """vllm backend: extra keyword arguments for ``vllm.LLM``."""
    prefix_cache_tokens: int = 32768
    """hf backend: most tokens of finished sequences whose KV is kept so that a
    conversation's next turn prefills only its new tokens (0: off)."""
    lora_mode: Literal["merged", "unmerged", "multi"] = "merged"
    """hf backend, LoRA policy: how pushed adapters are applied (``merged`` into the
    weights, ``unmerged`` beside them, ``multi``: several adapters served at once;
    ``forge.training.lora``)."""
    memory_fraction: float = 0.0
    """Share of the GPU's memory this replica may use (a run's ``placement.generator_memory``
    sets it; 0: no cap). vllm: its ``gpu_memory_utilization``; hf: its process's torch
    memory fraction (weights and KV cache). Needs a GPU."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"GeneratorConfig.backend: unknown generator backend {self.backend!r}; "
                f"choose one of {BACKENDS}"
            )
        fields = {f.name: f for f in dataclasses.fields(self)}
        for owner, knobs in BACKEND_KNOBS.items():
            if owner == self.backend:
                continue
            for name in knobs:
                f, value = fields[name], getattr(self, name)
                default = f.default_factory() if f.default is dataclasses.MISSING else f.default
                if value != default:
                    raise ValueError(
                        f"GeneratorConfig.{name}={value!r} is read by the {owner!r} backend "
                        f"only; with backend {self.backend!r} it would be ignored: remove it "
                        f"or set backend: {owner}"
                    )
        if isinstance(self.weights, dict):  # convenience for Python callers: nested dicts
            self.weights = WeightTransportConfig(**self.weights)
        elif not isinstance(self.weights, WeightTransportConfig):
            raise TypeError(
                "GeneratorConfig.weights must be a WeightTransportConfig (or a dict of its "
                f"fields), got {type(self.weights).__name__}"
            )
        # ``auto`` is decided where the generator runs (``with_precision``); vllm places
        # itself and picks its own kernels, so an explicit bf16 there is not judged
        if self.backend == "hf" and self.dtype != "auto":
            warn_if_slow_bf16("generator.dtype", self.dtype, self.device)
        if self.max_batch_size < 1:
            raise ValueError(
                f"GeneratorConfig.max_batch_size must be >= 1, got {self.max_batch_size}"
            )
        if self.prefix_cache_tokens < 0:
            raise ValueError(
                "GeneratorConfig.prefix_cache_tokens must be >= 0 (0 turns prefix reuse off), "
                f"got {self.prefix_cache_tokens}"
            )
        if self.lora_mode not in (*LORA_MODES, "multi"):
            raise ValueError(
                f"GeneratorConfig.lora_mode {self.lora_mode!r} is unknown; choose one of "
                f"{(*LORA_MODES, 'multi')}"
            )
        self._check_memory_fraction()
        if self.update_mode not in UPDATE_MODES:
            raise ValueError(
                f"GeneratorConfig.update_mode {self.update_mode!r} is not a mode; "
                f"choose one of {UPDATE_MODES}"
            )

    def with_precision(self) -> GeneratorConfig:
        """This config with ``dtype: auto`` decided for the device of the process that calls
        it (the replica's own; printed once per process); vllm places itself, so its
        ``auto`` is decided for the device this process sees (a GPU where one is visible).
        A config without ``auto`` is returned as it is."""
        if self.dtype != "auto":
            return self
        device = self.device if self.backend == "hf" else "auto"
        return dataclasses.replace(self, dtype=resolve_auto("generator.dtype", "auto", device))

    def _check_memory_fraction(self) -> None:
        f = self.memory_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f < 1.0:
            raise ValueError(f"GeneratorConfig.memory_fraction must be in [0, 1), got {f!r}")
        if not f:
            return
        if self.backend == "hf" and torch.device(self.device).type != "cuda":
            raise ValueError(
                f"GeneratorConfig.memory_fraction={f} caps GPU memory, but the hf generator "
                f"runs on device {self.device!r}; set device: cuda or remove it"
            )
        if "gpu_memory_utilization" in self.engine_kwargs:
            raise ValueError(
                "GeneratorConfig.memory_fraction and engine_kwargs.gpu_memory_utilization "
                "state the same fact; keep one (placement.generator_memory sets the first)"
            )


def state_dict_checksum(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class GeneratorBackend:
    """Generation on one model, with versioned weights. One per Generator replica.

    All methods run on the actor's event loop; blocking work goes to threads. ``version`` is
    the version that newly admitted requests are generated with.
    """

    version: int = 0

    async def start(self) -> None:
        """Load the model and start serving."""
        raise NotImplementedError

    async def generate(self, prompt: Prompt, params: SamplingParams) -> list[Completion]:
        """``params.n`` completions of ``prompt``; concurrent calls are batched together."""
        raise NotImplementedError

    async def update_weights(
        self, state_dict: dict[str, torch.Tensor], version: int, mode: str
    ) -> None:
        """Make ``state_dict`` (HF names) the weights of requests admitted from now on."""
        raise NotImplementedError

    async def update_weights_from(self, pull, version: int, mode: str) -> None:
        """Like ``update_weights``, given ``pull(into)``: a function that copies the version
        into the tensors of ``into`` (a name -> tensor dict) and returns it, or returns fresh
        tensors when ``into`` is None. Backends that can load in place override this to skip
        the intermediate copy; the default pulls fresh tensors."""
        state_dict = await asyncio.to_thread(pull, None)
        await self.update_weights(state_dict, version, mode)

    #: Whether ``update_weights_shared`` can compute with a version in place (read-only
    #: views of a same-host shared file) instead of copying it.
    can_share_weights = False

    async def update_weights_shared(
        self, state_dict: dict[str, torch.Tensor], lease: Any, version: int, mode: str
    ) -> None:
        """Like ``update_weights``, but ``state_dict``'s tensors are read-only views that the
        model uses as they are, valid while ``lease`` (a ``forge.weights.ShmLease``) is held;
        the backend releases it once no request computes with that version."""
        raise NotImplementedError

    async def load_adapter(
        self, name: str, version: int, state_dict: dict[str, torch.Tensor]
    ) -> None:
        """``lora_mode: multi``: serve a LoRA adapter version as ``name`` next to others."""
        raise NotImplementedError(
            f"{type(self).__name__} serves one adapter at a time; many adapters on one "
            "generator need the hf backend with lora_mode: multi"
        )

    def named_weights(self) -> dict[str, torch.Tensor]:
        """Current weights by HF name (what new requests use); for checks and debugging."""
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """Counters for tests and metrics (batch sizes, requests, tokens, updates)."""
        return {}

    async def sleep(self, level: int) -> None:
        """Time-sliced colocation (``placement.colocate``): let running requests finish, hold
        new ones until ``wake``, and free the KV cache (``level`` 1) and the weights too
        (``level`` 2; the next weight update materialises them again)."""
        raise NotImplementedError(f"{type(self).__name__} cannot sleep")

    async def wake(self) -> None:
        """Serve again after ``sleep`` (weights, then KV cache); a no-op when awake. A
        ``RuntimeError`` after a level-2 sleep that no successful weight update followed."""
        raise NotImplementedError(f"{type(self).__name__} cannot sleep")

    async def close(self) -> None:
        """Stop serving and release the model."""
