"""Generation cores that the Generator actor wraps: HF engine and sampling."""

from forge.generation.hf_engine import HFEngine
from forge.generation.sampling import sample_next, top_k_top_p_mask

__all__ = ["HFEngine", "sample_next", "top_k_top_p_mask"]
