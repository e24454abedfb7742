"""Guess the number, learned on a 2-core CPU: multi-turn GRPO in an environment.

Run:
    forge run --config apps/guess/cpu.yaml

    make_tiny_model ──▶ SFT on random guesses ──▶ GRPO: episodes in GuessNumber ──▶ success
                        (the format, not the strategy)   (higher / lower, <= 4 turns)

A short SFT on games where the assistant guesses at random teaches only the answer format;
GRPO must then discover the strategy from the environment's reward (1 for finding the number
in 1..8, less ``turn_cost`` = 0.1 per extra turn in ``cpu.yaml``; the feedback restates the
range still allowed). Every episode is token-in/token-out: the generator continues the
conversation's exact token ids, the environment's answers are appended as chat-template
tokens, and the loss counts only the tokens the policy sampled. The last line reads
``success_rate=<after> baseline=<after SFT> optimal=<binary search> mean_turns=<x>
minutes=<z>`` on the 8 held-out games (every number once, greedy).
"""

from __future__ import annotations

from pathlib import Path

from apps.guess.task import optimal_success_rate
from forge import EnvConfig, M, RLConfig, read_jsonl, sft_then_rl
from forge import PipelineConfig as Config

__all__ = ["Config", "run"]


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    env = environment(cfg)
    result = await sft_then_rl(cfg, run_dir, resume, "guess")
    env_kwargs = getattr(env.fn, "kwargs", {}) or {}
    optimal, optimal_turns = optimal_success_rate(env_kwargs.get("n", 16), env.max_turns)
    turns = _last_mean_turns(run_dir / "rl" / "metrics.jsonl")
    print(
        f"[guess] binary search: success {optimal:.3f} in {optimal_turns:.2f} turns on average; "
        f"the policy: {turns:.2f} turns"
    )
    print(
        f"success_rate={result['last']:.3f} baseline={result['first']:.3f} "
        f"optimal={optimal:.3f} mean_turns={turns:.2f} minutes={result['minutes']:.2f}",
        flush=True,
    )


def environment(cfg: Config) -> EnvConfig:
    """The RL stage's environment; a ``ValueError`` before anything runs if the stage is not
    a multi-turn GRPO run (the binary-search baseline needs the game's range and turns)."""
    if not isinstance(cfg.rl, RLConfig) or cfg.rl.env is None:
        raise ValueError(
            "apps.guess needs an rl stage with an env section (app: apps.grpo.main, env: "
            "{fn: apps.guess.task:GuessNumber, ...}), as apps/guess/cpu.yaml has"
        )
    return cfg.rl.env


def _last_mean_turns(path: Path) -> float:
    rows = read_jsonl(path)
    turns = [row[M.MEAN_TURNS] for row in rows if M.MEAN_TURNS in row]
    return turns[-1] if turns else float("nan")
