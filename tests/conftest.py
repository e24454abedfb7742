"""Test tiers, one folder each, on one axis: what a test costs.

=====================  ===========================================================  =========
folder                 what its tests do                                            tier
=====================  ===========================================================  =========
``unit/``              no process at all (its conftest refuses to start one)        fast
``checks/``            repository-wide checks in a fresh interpreter (ruff, import  fast
                       weight, deploy recipes)
``integration/``       real processes, one component at a time, seconds each;       fast
                       sub-folders follow the packages (``controller/``, ``actors/``,
                       ``training/``, ``components/``, ``envs/``) plus
                       ``hostile/`` (attacks on a running Forge)
``e2e/``               whole programs (``apps/``: ``forge run``, notebooks, chaos)   slow
                       and anything else over ~10 s (real models, the Tinker SDK,
                       multi-rank trainers), in sub-folders named after the
                       packages, as in ``integration/`` (and ``serve/``)
``multihost/``         simulated hosts in network namespaces (root, ``ip netns``)   slow
``vllm/``              the vLLM generator (``scripts/test_vllm.sh``, its own venv)  slow
=====================  ===========================================================  =========

The ``slow``, ``multihost`` and ``vllm`` marks are added here by folder, so
``pytest -m "not slow"`` (the fast tier) and ``pytest -m slow`` select by where a test lives;
a test that becomes slow moves to ``e2e/``. Ray on this host is slow tier: its backend's suite
is ``e2e/controller/test_ray_backend.py``, and the Ray case of the ``backend`` fixture
(``integration/controller/conftest_backends.py``, the service suites) carries the slow mark
itself, the one mark not given by folder.

Shared helpers sit beside this file: ``helpers.py`` (processes, scripts, ``forge run``),
``episodes.py`` (fake episodes from the tiny tokenizer), ``serve_process.py`` (a ``forge
serve`` process).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

# folder -> marks every test under it carries
FOLDER_MARKS = {
    "e2e": ("slow",),
    "multihost": ("slow", "multihost"),
    "vllm": ("slow", "vllm"),  # skipped in the main environment: no vllm there
}


def tier_of(path: Path) -> str:
    """The tier folder (``unit``, ``integration``, ``e2e``, ...) a test file lives in."""
    try:
        return Path(path).resolve().relative_to(HERE).parts[0]
    except (ValueError, IndexError):
        return ""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    # multihost/ first: it is one group on one worker (~7 minutes), so started last it left
    # the other worker idle at the end of the slow tier; first, the e2e files fill around it.
    items.sort(key=lambda item: tier_of(item.path) != "multihost")
    for item in items:
        tier = tier_of(item.path)
        for mark in FOLDER_MARKS.get(tier, ()):
            item.add_marker(getattr(pytest.mark, mark))
        # pytest-xdist (``-n 2 --dist loadgroup``, scripts/test.sh): a file's tests stay on one
        # worker (its module fixtures are built once), and the simulated hosts, which one
        # test at a time may use, keep all of multihost/ on one worker.
        if config.pluginmanager.hasplugin("xdist"):  # (the vLLM venv runs without it)
            group = "multihost" if tier == "multihost" else str(item.path)
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
async def _stop_everything():
    """Stop every mesh and service the test spawned in this process, so that none outlives
    its test. ``unit/`` overrides it (nothing to stop); a module whose fixtures keep
    processes for the whole module overrides it with a no-op of the same name."""
    yield
    from controller import shutdown

    await shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The "tiny" preset, built once per test session into a private cache."""
    from forge.models import ensure_tiny_model

    return str(ensure_tiny_model("tiny", cache_dir=tmp_path_factory.mktemp("models")))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A tiny Qwen2-style model built for this session (not the shared cache, which other
    test runs may be writing to)."""
    from forge.models import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))
