"""The ``backend`` fixture: run a test once per process backend (``local``, ``ray``,
``monarch``).

Bind it in a test module to use it (it is not a conftest, so it is not applied
everywhere)::

    from tests.integration.controller.conftest_backends import backend_fixture

    backend = backend_fixture

    async def test_something(backend):
        mesh = await MyActor.options(procs=2).as_actor()   # placed by ``backend``

The ray and monarch cases skip when their package is not installed and carry the ``ray`` or
``monarch`` mark (the ray case starts one Ray instance on this host per test process, and is
in the slow tier).
"""

from __future__ import annotations

import importlib.util

import pytest

_HAVE_MONARCH = importlib.util.find_spec("monarch") is not None
_HAVE_RAY = importlib.util.find_spec("ray") is not None


@pytest.fixture(
    name="backend",
    params=[
        "local",
        pytest.param(
            "ray",
            marks=[
                pytest.mark.ray,
                pytest.mark.slow,  # a Ray actor per rank: ~2x the spawn time of the others
                pytest.mark.skipif(not _HAVE_RAY, reason="needs ray"),
            ],
        ),
        pytest.param(
            "monarch",
            marks=[
                pytest.mark.monarch,
                pytest.mark.skipif(not _HAVE_MONARCH, reason="needs torchmonarch"),
            ],
        ),
    ],
)
def backend_fixture(request, monkeypatch) -> str:
    """Sets ``FORGE_BACKEND`` for the test; yields the backend's name."""
    monkeypatch.setenv("FORGE_BACKEND", request.param)
    return request.param
