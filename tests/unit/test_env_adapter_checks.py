"""Adapters' arguments are checked when the config loads (``check_config``), not when the
first episode builds the environment."""

from __future__ import annotations

import pytest

from forge.rollout.episodes import EnvConfig


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"fn": "textarena", "kwargs": {"game": "TicTacToe-v9"}}, "did you mean TicTacToe-v0"),
        ({"fn": "textarena", "kwargs": {"game": "TicTacToe-v0", "player_id": 2}}, "not a seat"),
        ({"fn": "openenv", "kwargs": {}}, "exactly one of base_url"),
        ({"fn": "verifiers", "kwargs": {"load": "nowhere.at_all:env"}}, "failed to import"),
    ],
)
def test_bad_adapter_arguments_fail_at_config_load(kwargs, error):
    with pytest.raises(ValueError, match=f"env.fn: .*{error}"):
        EnvConfig(fn=kwargs)


def test_good_adapter_arguments_load():
    EnvConfig(fn={"fn": "textarena", "kwargs": {"game": "TicTacToe-v0"}})
    EnvConfig(fn={"fn": "openenv", "kwargs": {"base_url": "http://127.0.0.1:1"}})
