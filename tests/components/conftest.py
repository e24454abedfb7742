import pytest

from controller import shutdown


@pytest.fixture(autouse=True)
async def _stop_everything():
    yield
    await shutdown()
