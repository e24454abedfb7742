"""``GeneratorConfig`` is checked when it is built: the backend's name, and the knobs only the
other backend reads (which would otherwise be silent no-ops)."""

from __future__ import annotations

import pytest

from forge.config import config_from_dict
from forge.generation import factory
from forge.generation.backend import BACKEND_KNOBS, BACKENDS, GeneratorConfig
from forge.weights import WeightTransportConfig


def test_every_backend_has_a_builder_and_its_knobs_are_fields():
    assert set(factory._BUILDERS) == set(BACKENDS) == set(BACKEND_KNOBS)
    fields = set(GeneratorConfig.__dataclass_fields__)
    assert {k for knobs in BACKEND_KNOBS.values() for k in knobs} <= fields


def test_a_misspelt_backend_fails_when_the_config_loads():
    with pytest.raises(ValueError, match=r"GeneratorConfig.backend: unknown generator backend "):
        GeneratorConfig(model="m", backend="vlm")
    # From YAML the Literal type lists the choices (it was the Python-side check's message).
    with pytest.raises(
        ValueError, match=r"backend: 'vlm' is not one of \['hf', 'vllm'\] \(did you mean"
    ):
        config_from_dict(GeneratorConfig, {"model": "m", "backend": "vlm"})


@pytest.mark.parametrize(
    ("backend", "knob", "owner"),
    [
        ("hf", {"engine_kwargs": {"gpu_memory_utilization": 0.5}}, "vllm"),
        ("vllm", {"attn_implementation": "sdpa"}, "hf"),
        ("vllm", {"prefix_cache_tokens": 0}, "hf"),
    ],
)
def test_a_knob_the_backend_ignores_is_an_error(backend, knob, owner):
    (name,) = knob
    with pytest.raises(
        ValueError, match=rf"GeneratorConfig.{name}=.* read by the '{owner}' backend only"
    ):
        GeneratorConfig(model="m", backend=backend, **knob)


def test_each_backend_takes_its_own_knobs_and_the_defaults_of_the_other():
    hf = GeneratorConfig(model="m", attn_implementation="sdpa", prefix_cache_tokens=0)
    assert hf.engine_kwargs == {}
    vllm = GeneratorConfig(model="m", backend="vllm", engine_kwargs={"max_model_len": 64})
    assert vllm.attn_implementation == "eager"


def test_weights_is_the_shared_transport_config():
    cfg = GeneratorConfig(model="m", weights={"prefix": "p", "share": False})
    assert cfg.weights == WeightTransportConfig(prefix="p", share=False)
    with pytest.raises(TypeError, match="must be a WeightTransportConfig"):
        GeneratorConfig(model="m", weights=3)


def test_a_generator_service_admits_a_full_batch_of_requests():
    """One-sample requests (the turns of multi-turn episodes) must be able to fill the batch:
    the services' default cap (10 in flight per replica) is raised to max_batch_size."""
    from forge.actors.generator import Generator

    assert Generator.service_defaults(GeneratorConfig(model="m", max_batch_size=128)) == {
        "replica_max_concurrent_requests": 128
    }
    assert Generator.service_defaults(GeneratorConfig(model="m", max_batch_size=8)) == {}
    assert Generator.service_defaults() == {}
