import pytest

from controller import shutdown


@pytest.fixture(autouse=True)
async def _stop_everything():
    yield
    await shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The "tiny" preset, built once per test session into a private cache."""
    from forge.models import ensure_tiny_model

    return str(ensure_tiny_model("tiny", cache_dir=tmp_path_factory.mktemp("models")))
