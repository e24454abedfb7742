"""``forge serve``'s stop tokens: token-id stops become their text (EOS is implicit) with the
base model's tokenizer, which is loaded once per base, not once per sampling request (a load
took ~0.3 s of the server's event loop: the cookbook recipe's sampling went 16 -> 1-4 s a
step when it was cached)."""

from __future__ import annotations

import forge.models
from forge.serve.app import _stop_strings
from forge.serve.serve_config import ServeConfig, toy_models
from forge.serve.state import SamplingSession, ServerState


def test_token_stops_become_text_and_the_tokenizer_is_loaded_once(tmp_path, monkeypatch):
    loads = []
    real = forge.models.load_tokenizer
    monkeypatch.setattr(forge.models, "load_tokenizer", lambda p: loads.append(p) or real(p))
    state = ServerState(ServeConfig(models=toy_models(), dir=str(tmp_path)))
    session = SamplingSession(generator=None, base="forge/tiny", model_id=None, version=0)
    tok = real(forge.serve.serve_config.resolve_path(state.cfg.base("forge/tiny")))
    some = tok.encode("a", add_special_tokens=False)[0]
    for _ in range(3):
        assert _stop_strings(state, session, [tok.eos_token_id, some, "\n\n"]) == ["a", "\n\n"]
    assert len(loads) == 1
    assert _stop_strings(state, session, ["x"]) == ["x"]  # strings need no tokenizer
