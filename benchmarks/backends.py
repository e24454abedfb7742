"""The CPU demo's seconds per GRPO step on each process backend, side by side.

    python -m benchmarks.backends [--runs 3] [--steps 60]

Runs ``forge run --config apps/sumdigits/cpu.yaml`` shortened (20 SFT steps, ``--steps`` GRPO
steps, no evaluation) with ``FORGE_BACKEND=local`` and ``FORGE_BACKEND=ray`` (a Ray instance
on this host, started by the run), interleaved, ``--runs`` times each. Per run it reports the
median ``time/step_s`` over the GRPO steps after the first 10 (warm-up) and the whole run's
wall time. The last line is machine-readable: ``ray_vs_local=<ratio of median s/step>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WARMUP = 10


def one_run(backend: str, steps: int) -> tuple[float, float]:
    """(median s/step after warm-up, wall seconds) of one shortened demo run."""
    with tempfile.TemporaryDirectory(prefix="forge-backends-") as tmp:
        env = {**os.environ, "FORGE_BACKEND": backend, "FORGE_CACHE_DIR": f"{tmp}/cache"}
        env.pop("RAY_ADDRESS", None)
        t0 = time.monotonic()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "forge.cli",
                "run",
                "--config",
                "apps/sumdigits/cpu.yaml",
                "--run-dir",
                f"{tmp}/run",
                "sft.steps=20",
                f"rl.steps={steps}",
                "rl.eval.every=0",
                "rl.eval.at_start=false",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        wall = time.monotonic() - t0
        if out.returncode != 0:
            raise RuntimeError(f"{backend} run failed:\n{out.stderr[-3000:]}")
        rows = [json.loads(x) for x in Path(f"{tmp}/run/rl/metrics.jsonl").read_text().splitlines()]
    steps_s = [r["time/step_s"] for r in rows if "time/step_s" in r][WARMUP:]
    return statistics.median(steps_s), wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    a = p.parse_args()
    res: dict[str, list[tuple[float, float]]] = {"local": [], "ray": []}
    for i in range(a.runs):
        for backend in ("local", "ray"):
            res[backend].append(one_run(backend, a.steps))
            s, wall = res[backend][-1]
            print(f"run {i + 1} {backend:5s}  median s/step {s:.3f}  wall {wall:.1f} s", flush=True)
    med = {b: statistics.median(s for s, _ in r) for b, r in res.items()}
    for b, r in res.items():
        print(
            f"{b:5s}  median s/step {med[b]:.3f}  (runs {' '.join(f'{s:.3f}' for s, _ in r)}), "
            f"median wall {statistics.median(w for _, w in r):.1f} s"
        )
    print(f"ray_vs_local={med['ray'] / med['local']:.2f}")


if __name__ == "__main__":
    main()
