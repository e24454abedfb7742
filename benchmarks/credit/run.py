"""Credit over turns, measured: each game trained by each method at several seeds, same budget.

    python -m benchmarks.credit.run [--games subtraction guess16] [--methods episode gigpo
        state_baseline ppo_turns] [--seeds 0 1 2] [--out results.json] [-- key=value ...]

Every run is ``forge run --config benchmarks/credit/<game>.yaml seed=<s> <method's overrides>``
in real processes, in a fresh cache (the base model is built at that seed, then SFT on random
legal play: the format and the rules, not the strategy); each run's directory is kept under
``--keep`` as ``<game>-<method>-s<seed>`` (``benchmarks/credit/trl_multiturn.py`` starts TRL
from a run's SFT model). Methods:

- ``episode``: multi-turn GRPO, every turn credited with its episode's advantage;
- ``gigpo``: ``rollout.credit: gigpo`` (step-level groups of turns taken in the same state);
- ``state_baseline``: ``rollout.credit: state_baseline`` (each turn against the running mean
  return of its state over the whole run);
- ``ppo_turns``: PPO with a critic over turns (``critic.level: turn``, loss ``ppo``).

Prints one row per run (greedy held-out success after SFT and after RL, mean sampled success
over the last 10 steps, minutes) and a table per game of median [min-max] over seeds, with
the optimal rule's and random legal play's success rates. ``--report FILE [--trl X.json ..]``
prints the tables of earlier runs (and of ``benchmarks/credit/trl_multiturn.py``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

METHODS = {
    "episode": [],
    "gigpo": ["rl.rollout.credit=gigpo"],
    "state_baseline": ["rl.rollout.credit=state_baseline"],
    "ppo_turns": [
        "rl.critic.level=turn",
        "rl.trainer.loss.type=ppo",
        "rl.critic.optimizer.lr=5e-4",
    ],
}
GAMES = {
    "subtraction": "benchmarks/credit/subtraction.yaml",
    "guess16": "benchmarks/credit/guess16.yaml",
}


def run_once(config: str, seed: int, overrides: list[str], run_dir: Path, timeout: float) -> dict:
    """One run at ``seed`` into ``run_dir`` (its cache inside); its summary line as numbers."""
    env = {**os.environ, "FORGE_CACHE_DIR": str(run_dir / "cache")}
    cmd = [
        sys.executable,
        "-m",
        "forge.cli",
        "run",
        "--config",
        config,
        "--run-dir",
        str(run_dir / "run"),
        f"seed={seed}",
        *overrides,
    ]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("success_rate=")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(
            f"{config} seed {seed} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        )
    row = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", lines[-1])}
    row["rl_minutes"] = rl_minutes(run_dir / "run" / "rl" / "metrics.jsonl")
    return {"seed": seed, "wall_minutes": (time.monotonic() - t0) / 60, **row}


def rl_minutes(metrics: Path) -> float:
    """Minutes of the RL stage's training loop (its last ``time/elapsed_s``): without start-up
    and SFT, evaluations included."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    elapsed = [r["time/elapsed_s"] for r in rows if "time/elapsed_s" in r]
    return elapsed[-1] / 60 if elapsed else float("nan")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def report_rows(path: Path, keep: Path, trl: list[Path]) -> list[dict]:
    """The runs of a ``--out`` file (RL minutes read from their kept directories when the
    row lacks them), then TRL's runs of the subtraction game as method ``trl_grpo``."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for r in rows:
        if "rl_minutes" not in r:
            metrics = keep / f"{r['game']}-{r['method']}-s{r['seed']}" / "run/rl/metrics.jsonl"
            r["rl_minutes"] = rl_minutes(metrics) if metrics.exists() else float("nan")
    first = next((r for r in rows if r["game"] == "subtraction"), {"optimal": 1.0})
    for t in trl:
        d = json.loads(t.read_text())
        rows.append(
            {
                "game": "subtraction",
                "method": "trl_grpo",
                "optimal": first["optimal"],
                **d,
                "rl_minutes": d["minutes"],
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    """A markdown table per game: median [min-max] over seeds per method."""
    out = []
    for game in dict.fromkeys(r["game"] for r in rows):
        mine = [r for r in rows if r["game"] == game]
        opt, rand = mine[0]["optimal"], mine[0]["random"]
        out += [
            f"\n{game}: optimal rule {opt:.3f}, random legal play {rand:.3f}\n",
            "| method | seeds | after SFT | greedy after RL | sampled (last 10 steps) | "
            "RL minutes |",
            "|---|---|---|---|---|---|",
        ]
        for method in dict.fromkeys(r["method"] for r in mine):
            rs = [r for r in mine if r["method"] == method]
            out.append(
                f"| {method} | {len(rs)} | {_spread([r['baseline'] for r in rs])} | "
                f"{_spread([r['success_rate'] for r in rs])} | "
                f"{_spread([r['sampled'] for r in rs])} | "
                f"{statistics.median(r['rl_minutes'] for r in rs):.1f} |"
            )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", help="append each run to this JSON-lines file")
    p.add_argument("--keep", default="/tmp/forge-credit", help="run directories go here")
    p.add_argument("--report", help="print the tables of this JSON-lines file and stop")
    p.add_argument("--trl", nargs="*", default=[], help="with --report: trl_multiturn JSONs")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    a = p.parse_args()
    if a.report:
        print(table(report_rows(Path(a.report), Path(a.keep), [Path(t) for t in a.trl])))
        return
    rows = []
    for game in a.games:
        for seed in a.seeds:
            for method in a.methods:
                extra = METHODS[method] + a.overrides
                run_dir = Path(a.keep) / f"{game}-{method}-s{seed}"
                row = {
                    "game": game,
                    "method": method,
                    **run_once(GAMES[game], seed, extra, run_dir, a.timeout),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
                if a.out:
                    with Path(a.out).open("a") as f:
                        f.write(json.dumps(row) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
