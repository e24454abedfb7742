"""Generation: the HF engine, sampling, and the backends the Generator actor wraps."""

from forge.generation.backend import GeneratorBackend, GeneratorConfig
from forge.generation.factory import build_generator_backend
from forge.generation.hf_engine import HFEngine
from forge.generation.sampling import counter_uniform, sample_next, top_k_top_p_mask

__all__ = [
    "GeneratorBackend",
    "GeneratorConfig",
    "HFEngine",
    "build_generator_backend",
    "counter_uniform",
    "sample_next",
    "top_k_top_p_mask",
]
