"""Generation: the HF engine, sampling, and the backends the Generator actor wraps.

Names load on first use, so that ``forge.generation.hf_engine`` and ``sampling`` import
without the backends' config, which pulls in the weight transports and the actor runtime
(``scripts/gpu_check.sh`` runs the engine where only torch and transformers are installed).
"""

import importlib

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
