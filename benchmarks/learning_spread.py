"""Run-to-run spread of a demo's learning: the same config at several seeds, in real processes.

The slow tests check that each demo learns against a threshold; this measures the spread
those thresholds are set from. Each run is ``forge run --config <demo> seed=<s> <overrides>``
in a fresh cache (the mini model is rebuilt at that seed), and the demo's last summary line
(``key=value ...``) is kept.

    python -m benchmarks.learning_spread --config apps/sumdigits/cpu.yaml --seeds 0 1 2 3 \\
        --gain heldout_accuracy sft_accuracy -- rl.steps=150 rl.eval.every=0

prints one row per run and the min / median / max of ``gain = a - b``; ``--out`` keeps them
as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(config: str, seed: int, overrides: list[str], timeout: float) -> dict[str, float]:
    """One demo run at ``seed``; its last ``key=value`` summary line as numbers."""
    with tempfile.TemporaryDirectory(prefix="forge-spread-") as tmp:
        env = {**os.environ, "FORGE_CACHE_DIR": str(Path(tmp) / "cache")}
        cmd = [
            sys.executable,
            "-m",
            "forge.cli",
            "run",
            "--config",
            config,
            "--run-dir",
            str(Path(tmp) / "run"),
            f"seed={seed}",
            *overrides,
        ]
        t0 = time.monotonic()
        out = subprocess.run(
            cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
        )
        if out.returncode != 0:
            raise RuntimeError(f"seed {seed} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    lines = [ln for ln in out.stdout.splitlines() if re.match(r"^\w+=[\d.]+", ln)]
    if not lines:
        raise RuntimeError(f"seed {seed}: no 'key=value' summary line in:\n{out.stdout[-2000:]}")
    row = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", lines[-1])}
    return {"seed": seed, "minutes": (time.monotonic() - t0) / 60, **row}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--gain", nargs=2, metavar=("AFTER", "BEFORE"), required=True)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", help="write the runs and the summary here as JSON")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    a = p.parse_args()
    after, before = a.gain
    rows = []
    for seed in a.seeds:
        row = run_once(a.config, seed, a.overrides, a.timeout)
        row["gain"] = row[after] - row[before]
        rows.append(row)
        print(json.dumps(row), flush=True)
    gains = [r["gain"] for r in rows]
    summary = {
        "config": a.config,
        "overrides": a.overrides,
        "gain": f"{after} - {before}",
        "min": min(gains),
        "median": statistics.median(gains),
        "max": max(gains),
        "after_min": min(r[after] for r in rows),
        "runs": rows,
    }
    print(
        f"{a.config} {' '.join(a.overrides)}: gain {after} - {before} over {len(rows)} seeds: "
        f"min {summary['min']:.3f}  median {summary['median']:.3f}  max {summary['max']:.3f}"
    )
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
