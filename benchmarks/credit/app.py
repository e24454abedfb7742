"""SFT then multi-turn RL on a measurement game; one summary line for the benchmark.

    forge run --config benchmarks/credit/subtraction.yaml [a.b=c ...]

The last line reads ``success_rate=<greedy held-out, after> baseline=<after SFT>
sampled=<mean sampled success, last 10 steps> sampled_first=<first 10 steps>
optimal=<the optimal rule> random=<random legal play> minutes=<wall>``.
"""

from __future__ import annotations

import json
from pathlib import Path

from forge import M, sft_then_rl
from forge import PipelineConfig as Config

__all__ = ["Config", "run"]


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    r = await sft_then_rl(cfg, run_dir, resume, "credit")
    sampled = _sampled_success(run_dir / "rl" / "metrics.jsonl")
    optimal, rand = baselines(cfg)
    print(
        f"success_rate={r['last']:.3f} baseline={r['first']:.3f} sampled={sampled[1]:.3f} "
        f"sampled_first={sampled[0]:.3f} optimal={optimal:.3f} random={rand:.3f} "
        f"minutes={r['minutes']:.2f}",
        flush=True,
    )


def baselines(cfg: Config) -> tuple[float, float]:
    """The optimal rule's and random legal play's success rates in this run's game."""
    fn = cfg.rl.env.fn
    name, kwargs = (fn, {}) if isinstance(fn, str) else (fn.fn, dict(fn.kwargs))
    if name.startswith("benchmarks.credit.subtraction"):
        from benchmarks.credit.subtraction import random_success_rate

        data = cfg.rl.data.kwargs if not isinstance(cfg.rl.data, str) else {}
        return 1.0, random_success_rate(data.get("low", 5), data.get("high", 15))
    from apps.guess.task import optimal_success_rate, random_success_rate

    n, turns = kwargs.get("n", 16), cfg.rl.env.max_turns
    return optimal_success_rate(n, turns)[0], random_success_rate(n, turns)


def _sampled_success(path: Path, window: int = 10) -> tuple[float, float]:
    """Mean sampled success (``rollout/reward/success``) over the first and last steps."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    vals = [r[M.reward("success")] for r in rows if M.reward("success") in r]
    if not vals:
        return float("nan"), float("nan")
    first, last = vals[:window], vals[-window:]
    return sum(first) / len(first), sum(last) / len(last)
