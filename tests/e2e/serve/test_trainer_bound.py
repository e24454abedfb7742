"""``forge serve`` bounds its calls to a training client's trainer by
``FORGE_CALL_TIMEOUT_S`` (issue 32, item 10): a trainer that stops answering fails the
request that waits on it instead of holding it for good."""

from __future__ import annotations

from forge.serve.serve_config import ServeConfig, toy_models
from forge.serve.state import ServerState


async def test_the_trainer_a_training_client_gets_is_bounded(tmp_path, monkeypatch):
    # spawns a trainer and a generator (about 20 s here): e2e
    monkeypatch.setenv("FORGE_CALL_TIMEOUT_S", "7")
    state = ServerState(ServeConfig(models=toy_models(), dir=str(tmp_path / "serve")))
    mid = await state.create_model("forge/tiny", {"rank": 4}, "m-0")
    trainer = state.models[mid].trainer
    assert trainer._default_timeout == 7.0
    # still the same actor: an ordinary call works through the bounded handle
    await trainer.push_weights.call_one(1)
    await state.close()
