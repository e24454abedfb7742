"""SFT then GRPO on TextArena TicTacToe games through ``forge run`` (the environment's own
tests: tests/unit/test_textarena.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from forge.integrations.textarena import TextArenaEnv  # noqa: E402
from forge.models import make_tiny_model  # noqa: E402
from tests.helpers import forge_run, script_env  # noqa: E402
from tests.unit.test_textarena import LOWEST, PIPELINE


@pytest.mark.timeout(300)
def test_sft_then_grpo_trains_on_tictactoe_episodes(tmp_path):
    """A short SFT on random valid moves (the format), then GRPO steps on whole TicTacToe
    games against the random opponent, through ``forge run``."""
    corpus = [asyncio.run(TextArenaEnv("TicTacToe-v0", opponent=LOWEST).reset({})) * 4] * 20
    model = make_tiny_model(tmp_path / "model", preset="tiny", corpus=corpus)
    config = tmp_path / "tictactoe.yaml"
    config.write_text(PIPELINE.format(model=model, sft_steps=20, rl_steps=4))
    run = tmp_path / "run"
    out = forge_run(
        ["--config", str(config), "--run-dir", str(run)],
        timeout=280,
        env=script_env(FORGE_CACHE_DIR=str(tmp_path / "cache")),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 4
    # A step whose batch was all rolled out before the step began logs no rollout metrics.
    played = [r for r in steps if "env/turns" in r]
    assert len(played) >= 2, steps
    for r in played:
        assert 1.0 <= r["env/turns"] <= 3.0 and r["env/sampled_tokens"] > 0
    # The game's components are logged once a batch has a finished game (3 turns rarely
    # finish one: most end at max_turns with no reward).
    assert any({"rollout/reward/success", "rollout/reward/invalid"} <= set(r) for r in steps)
    # Untrained, every game is lost by two invalid moves (invalid -1, 2 turns); after the
    # SFT on valid moves, games go on.
    assert max(r.get("rollout/reward/invalid", 0.0) for r in steps) > -1.0
    assert max(r["env/turns"] for r in played) > 2.0
