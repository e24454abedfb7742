"""Generation: the HF engine, sampling, and the backends the Generator actor wraps.

Names load on first use, so that ``forge.generation.hf_engine`` and ``sampling`` import
without the backends' config, which pulls in the weight transports and the actor runtime
(``scripts/gpu_check.sh`` runs the engine where only torch and transformers are installed).
"""

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "GeneratorBackend": "forge.generation.backend",
    "GeneratorConfig": "forge.generation.backend",
    "HFEngine": "forge.generation.hf_engine",
    "build_generator_backend": "forge.generation.factory",
    "counter_uniform": "forge.generation.sampling",
    "sample_next": "forge.generation.sampling",
    "top_k_top_p_mask": "forge.generation.sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'forge.generation' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# Every lazy name, for type checkers and editors (PEP 562's ``__getattr__`` is opaque to
# them). tests/unit/test_public_api.py checks this block names exactly ``_EXPORTS``.
if TYPE_CHECKING:  # pragma: no cover - never runs
    from forge.generation.backend import (
        GeneratorBackend,
        GeneratorConfig,
    )
    from forge.generation.factory import build_generator_backend
    from forge.generation.hf_engine import HFEngine
    from forge.generation.sampling import (
        counter_uniform,
        sample_next,
        top_k_top_p_mask,
    )
