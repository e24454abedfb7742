"""Algorithms side by side on the CPU demo: held-out accuracy under one step budget.

    python -m benchmarks.algorithms [--only grpo ppo ...] [--grpo-steps 500] [--sft-steps 250]

Each variant is ``forge run --config apps/sumdigits/<cfg>.yaml`` with the overrides below:
the same tiny model (built once, cached), the same SFT stage and the same number of RL steps
(``prompts_per_step=16 x group_size=8`` completions per step). The SFT accuracy is the same
for every variant (same seed); the table shows held-out accuracy after RL, minutes, and the
run directory (``curves.png`` and ``metrics.jsonl`` inside). Runs one variant at a time, so
about 6-8 minutes each on a 2-core machine. The last line is machine-readable:
``algorithms <name>=<accuracy> ...``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

VARIANTS: dict[str, tuple[str, list[str]]] = {
    # the demo as shipped: GRPO, TIS, dynamic sampling (nonzero-variance filter, 5x budget)
    "grpo": ("cpu", []),
    # PPO: a critic (value head on the SFT body), GAE(1, 1), whitened per-token advantages
    "ppo": ("ppo", []),
    # DAPO: clip-higher, token-mean aggregation, dynamic sampling, soft overlong penalty
    "dapo": ("cpu", ["rl.trainer.loss.clip_eps_high=0.28", "rl.rollout.overlong_buffer=2"]),
    # REINFORCE leave-one-out advantages instead of GRPO's z-score
    "rloo": ("cpu", ["rl.rollout.advantage=rloo"]),
    # GRPO with a KL penalty to an EMA reference (its model: the policy's), switched down
    # half-way by a phase
    "grpo_kl_ema": (
        "cpu",
        [
            "rl.reference.update.type=ema",
            "rl.reference.update.decay=0.95",
            "rl.trainer.loss.kl_coef=0.1",
            "rl.phases=[{at: 250, name: low-kl, loss: {kl_coef: 0.02}}]",
        ],
    ),
}


def run_variant(name: str, args, root: Path) -> dict:
    config, overrides = VARIANTS[name]
    run_dir = root / name
    cmd = [
        sys.executable,
        "-m",
        "forge.cli",
        "run",
        "--config",
        str(REPO / "apps" / "sumdigits" / f"{config}.yaml"),
        "--run-dir",
        str(run_dir),
        f"sft.steps={args.sft_steps}",
        f"rl.steps={args.grpo_steps}",
        f"rl.trainer.schedule.total_steps={args.grpo_steps}",
        *overrides,
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=dict(os.environ))
    minutes = (time.perf_counter() - t0) / 60
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("heldout_accuracy=")]
    if out.returncode != 0 or not lines:
        print(f"[algorithms] {name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        return {"name": name, "ok": False, "run_dir": run_dir}
    vals = dict(re.findall(r"(\w+)=([\d.]+)", lines[-1]))
    return {
        "name": name,
        "ok": True,
        "heldout": float(vals["heldout_accuracy"]),
        "sft": float(vals["sft_accuracy"]),
        "minutes": minutes,
        "run_dir": run_dir,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--grpo-steps", type=int, default=500)
    p.add_argument("--sft-steps", type=int, default=250)
    p.add_argument("--out", default="", help="runs directory (default: a temporary one)")
    args = p.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="forge-algorithms-"))
    print(f"[algorithms] runs in {root}; load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for name in args.only:
        r = run_variant(name, args, root)
        results.append(r)
        if r["ok"]:
            print(
                f"[algorithms] {name}: heldout {r['heldout']:.3f} (sft {r['sft']:.3f}) "
                f"in {r['minutes']:.1f} min",
                flush=True,
            )
    print(f"\n| algorithm | held-out after SFT | after {args.grpo_steps} RL steps | minutes |")
    print("|---|---|---|---|")
    for r in results:
        if r["ok"]:
            print(f"| {r['name']} | {r['sft']:.3f} | {r['heldout']:.3f} | {r['minutes']:.1f} |")
        else:
            print(f"| {r['name']} | failed | | |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    ok = " ".join(f"{r['name']}={r['heldout']:.3f}" for r in results if r["ok"])
    print(f"algorithms {ok}")


if __name__ == "__main__":
    main()
