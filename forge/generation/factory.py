"""``build_generator_backend``: the backend ``GeneratorConfig.backend`` names.

Kept apart from ``backend.py`` (the base class and config, which the backends import) so the
backends import ``backend.py`` and nothing there imports them back. Each backend loads only
when chosen (the vllm one imports vLLM).
"""

from __future__ import annotations

from collections.abc import Callable

from forge.generation.backend import BACKENDS, GeneratorBackend, GeneratorConfig

__all__ = ["build_generator_backend"]


def _hf(config: GeneratorConfig) -> GeneratorBackend:
    from forge.generation.hf_backend import HFBackend

    return HFBackend(config)


def _vllm(config: GeneratorConfig) -> GeneratorBackend:
    from forge.generation.vllm_backend import VLLMBackend

    return VLLMBackend(config)


_BUILDERS: dict[str, Callable[[GeneratorConfig], GeneratorBackend]] = {"hf": _hf, "vllm": _vllm}


def build_generator_backend(config: GeneratorConfig) -> GeneratorBackend:
    """The backend named by ``config.backend``, built with ``dtype: auto`` decided for this
    process's device (``GeneratorConfig.with_precision``); ``ValueError`` for an unknown name
    (which ``GeneratorConfig`` already rejects when it is built)."""
    build = _BUILDERS.get(config.backend)
    if build is None:
        raise ValueError(
            f"unknown generator backend type: {config.backend!r}; choose one of {BACKENDS}"
        )
    return build(config.with_precision())  # ``dtype: auto`` decided in this, the replica's, process
