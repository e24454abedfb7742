"""The Generator actor's pluggable engine: config, backend base class and factory.

A backend turns ``(prompt, SamplingParams)`` into ``Completion`` lists on one model whose
weights carry an integer version, and swaps in new weights on request. The actor
(``forge.actors.generator``) owns transport and version bookkeeping; a backend only sees
state dicts. Implementations live in sibling files and are chosen by
``GeneratorConfig.backend`` through :func:`build_generator_backend`:

- ``"hf"`` (``hf_backend.py``): plain transformers + ``HFEngine``, continuous batching on an
  asyncio task. Runs anywhere torch runs; what the tests and laptop runs use.
- ``"vllm"`` (``vllm_backend.py``): ``vllm.LLM`` in the actor process (needs ``forge[vllm]``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.types import Completion, SamplingParams

__all__ = [
    "BACKENDS",
    "UPDATE_MODES",
    "GeneratorBackend",
    "GeneratorConfig",
    "WeightPullConfig",
    "Prompt",
    "build_generator_backend",
    "encode_prompt",
    "make_sampling_params",
    "state_dict_checksum",
]

BACKENDS = ("hf", "vllm")
UPDATE_MODES = ("in_flight", "drain")
# A prompt: plain text, chat messages (rendered with the chat template), or token ids (used
# verbatim: multi-turn rollouts send the whole conversation as the ids they have built).
Prompt = str | list[dict[str, Any]] | list[int]


def encode_prompt(
    tokenizer, prompt: Prompt, max_positions: int | None = None
) -> tuple[str, list[int]]:
    """``(text, ids)`` of a prompt, the one encoding rule every generator backend uses.

    - ``str``: tokenised with the tokenizer's special tokens (e.g. a BOS).
    - chat messages (a list of dicts): the chat template with ``add_generation_prompt=True``,
      tokenised without adding special tokens (the template already holds any BOS).
    - token ids (a non-empty list of ints): used verbatim, nothing added; ``text`` is
      ``tokenizer.decode(ids)``, for the record only.

    ``max_positions`` (the model's context length): a prompt of that many tokens or more is a
    ``ValueError``, since no token could be generated after it. ``TypeError`` for any other
    prompt type, ``ValueError`` for a prompt that encodes to zero tokens.
    """
    if isinstance(prompt, str):
        text = prompt
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    elif isinstance(prompt, list) and prompt:
        bad = [t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or t < 0]
        if bad:
            raise TypeError(
                f"a token-id prompt must hold only ints >= 0, got {type(bad[0]).__name__} "
                f"{bad[0]!r}; pass a string, chat messages (dicts) or a list of token ids"
            )
        ids = list(prompt)
        text = tokenizer.decode(ids)
    elif isinstance(prompt, list):
        raise ValueError("prompt is an empty list; pass chat messages or token ids")
    else:
        raise TypeError(
            "prompt must be a string or a list of chat messages (dicts) or of token ids "
            f"(ints), got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError("prompt encodes to zero tokens; pass a non-empty prompt")
    if max_positions is not None and len(ids) >= max_positions:
        raise ValueError(
            f"prompt has {len(ids)} tokens but the model's max_position_embeddings "
            f"is {max_positions}; shorten the prompt"
        )
    return text, ids


@dataclass
class WeightPullConfig:
    """Where the generator pulls pushed versions from when given a version, not a handle.

    ``transport`` is ``"shm"`` (same host; files ``forge-w-<prefix>-v<version>`` under
    ``shm_dir``) or ``"safetensors_dir"`` (``<root>/v<version>``); it must match the
    trainer's ``WeightStore``. An empty shm ``prefix`` means the run's publication location
    (where a trainer with no ``weights.prefix`` pushes; ``forge.weights.pull``); an empty
    ``root`` (safetensors_dir) means "handles only": ``update_weights`` then needs a
    ``WeightHandle``.

    ``share`` (hf backend on CPU, shm handles whose dtypes match the model): the replica
    computes with the pushed file's bytes in place, read-only, instead of copying them into
    its model, so replicas on a host hold one copy of a version and a pull copies nothing.
    While a replica uses a version, the trainer writes newer ones to other files.
    """

    transport: str = "shm"
    prefix: str = ""
    shm_dir: str = "/dev/shm"
    root: str = ""
    wait_s: float = 0.0
    share: bool = True


@dataclass
class GeneratorConfig:
    """Everything a Generator replica needs to start.

    Args:
        model: local HF model directory or hub id.
        backend: ``"hf"`` or ``"vllm"``; checked when the replica starts (``setup``).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        device: torch device of the hf backend (``"cpu"``, ``"cuda"``).
        max_batch_size: most sequences (samples, not requests) decoded together.
        sampling: defaults for every ``generate`` call; keyword overrides replace fields.
        seed: seeds the sampling streams of requests that give no ``seed``.
        update_mode: default for ``update_weights``: ``"in_flight"`` (no drain; hf: running
            requests finish on the weights they started with, in a second lane; vllm: they
            continue on the new weights, see ``vllm_backend``) or ``"drain"`` (wait until
            idle, then swap).
        attn_implementation: hf backend attention (``"eager"`` matches the trainer's
            logprob recomputation bit-for-bit on CPU; ``"sdpa"`` is faster on GPUs).
        weights: where versions are pulled from by number.
        engine_kwargs: extra keyword arguments for the backend's engine (``vllm.LLM``).
        prefix_cache_tokens: hf backend: most tokens of finished sequences whose KV is kept
            so that a conversation's next turn prefills only its new tokens (0: off).
    """

    model: str
    backend: str = "hf"
    dtype: str = "float32"
    device: str = "cpu"
    max_batch_size: int = 32
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    update_mode: str = "in_flight"
    attn_implementation: str = "eager"
    weights: WeightPullConfig = field(default_factory=WeightPullConfig)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    prefix_cache_tokens: int = 32768

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(
                f"GeneratorConfig.max_batch_size must be >= 1, got {self.max_batch_size}"
            )
        if self.prefix_cache_tokens < 0:
            raise ValueError(
                "GeneratorConfig.prefix_cache_tokens must be >= 0 (0 turns prefix reuse off), "
                f"got {self.prefix_cache_tokens}"
            )
        if self.update_mode not in UPDATE_MODES:
            raise ValueError(
                f"GeneratorConfig.update_mode {self.update_mode!r} is not a mode; "
                f"choose one of {UPDATE_MODES}"
            )


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "n": (int,),
    "max_tokens": (int,),
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "stop": (str, list, tuple),
    "seed": (int, type(None)),
    "logprobs": (bool,),
}


def make_sampling_params(defaults: SamplingParams, overrides: dict[str, Any]) -> SamplingParams:
    """``defaults`` with ``overrides`` applied and validated.

    Raises ``TypeError`` naming unknown keys (and listing the valid ones) or a value of the
    wrong type; ``ValueError`` (from ``SamplingParams``) for an out-of-range value.
    """
    unknown = sorted(set(overrides) - set(_FIELD_TYPES))
    if unknown:
        raise TypeError(
            f"unknown sampling parameter(s) {unknown}; valid ones are {list(_FIELD_TYPES)}"
        )
    for key, value in overrides.items():
        bad_bool = isinstance(value, bool) and key != "logprobs"  # bool is an int subclass
        if bad_bool or not isinstance(value, _FIELD_TYPES[key]):
            raise TypeError(
                f"sampling parameter {key}={value!r} has type {type(value).__name__}; "
                f"expected {' or '.join(t.__name__ for t in _FIELD_TYPES[key])}"
            )
    if "stop" in overrides and not isinstance(overrides["stop"], str):
        overrides = {**overrides, "stop": list(overrides["stop"])}
    params = dataclasses.replace(defaults, **overrides)
    params.stop = list(params.stop)  # never share the defaults' list
    return params


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

    def named_weights(self) -> dict[str, torch.Tensor]:
        """Current weights by HF name (what new requests use); for checks and debugging."""
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """Counters for tests and metrics (batch sizes, requests, tokens, updates)."""
        return {}

    async def close(self) -> None:
        """Stop serving and release the model."""


def build_generator_backend(config: GeneratorConfig) -> GeneratorBackend:
    """The backend named by ``config.backend``; ``ValueError`` for an unknown name."""
    kind = config.backend
    if kind == "hf":
        from forge.generation.hf_backend import HFBackend

        return HFBackend(config)
    if kind == "vllm":
        from forge.generation.vllm_backend import VLLMBackend

        return VLLMBackend(config)
    raise ValueError(f"unknown generator backend {kind!r}; choose one of {BACKENDS}")
