"""The Tinker RL loop against ``forge serve``: steps per second, and where a step's time goes.

    python -m benchmarks.tinker_loop [--steps 20] [--repeats 3] [--group 8]

Starts ``forge serve`` (the tiny CPU model), then per repeat runs ``apps/tinker/rl_loop.py``
(the ``tinker`` SDK only, in its own process: a new LoRA training client, then ``--steps``
steps of: save the weights for sampling, sample 4 prompts x ``--group`` completions of 12
tokens, importance-sampling ``forward_backward``, ``optim_step``, waited for) and reads the
per-phase times it prints. Reported: steps/s
(median over repeats), the client's seconds per step in each phase, and the server's split
of the same calls (``GET /forge/v1/stats``): seconds inside Forge's trainer and generator
actors against seconds from the request's arrival to its result. The client's time minus the
server's is HTTP, the SDK's polling of futures and (de)serialisation.
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

KEY = "tml-bench-key-0123456789abcdef"


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge.cli",
            "serve",
            "--preset",
            "toy",
            "--port",
            "0",
            "--api-key",
            KEY,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if m := re.search(r"Tinker API on (http://\S+)", line):
            return proc, m.group(1)
        if not line:
            break
    proc.kill()
    raise RuntimeError("forge serve did not start")


def one_run(url: str, steps: int, group: int) -> dict:
    """Run ``apps/tinker/rl_loop.py`` (the SDK only, its own process); parse its step lines."""
    env = {**os.environ, "TINKER_API_KEY": KEY}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "apps.tinker.rl_loop",
            "--base-url",
            url,
            "--steps",
            str(steps),
            "--group",
            str(group),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    phases = {"save_for_sampler": 0.0, "sample": 0.0, "train": 0.0}
    for m in re.finditer(r"save ([\d.]+) sample ([\d.]+) train ([\d.]+)", out):
        for key, value in zip(phases, m.groups()):
            phases[key] += float(value)
    last = dict(re.findall(r"(\w+)=([-\d.]+)", out.strip().splitlines()[-1]))
    wall = float(last["seconds"])
    return {
        "steps_per_s": steps / wall,
        "wall_s": wall,
        "phases": phases,
        "reward_first": float(last["first"]),
        "reward_last": float(last["last"]),
    }


def server_stats(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/forge/v1/stats", headers={"X-API-Key": KEY}, timeout=10).json()[
        "kinds"
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--group", type=int, default=8)
    args = p.parse_args()
    proc, url = start_server()
    try:
        runs = []
        for r in range(args.repeats):
            before = server_stats(url)
            run = one_run(url, args.steps, args.group)
            after = server_stats(url)
            run["server"] = {
                k: {f: v[f] - before.get(k, {}).get(f, 0) for f in ("n", "total_s", "actor_s")}
                for k, v in after.items()
            }
            runs.append(run)
            print(
                f"[tinker_loop] repeat {r}: {run['steps_per_s']:.2f} steps/s, reward "
                f"{run['reward_first']:.2f} -> {run['reward_last']:.2f}",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(60)
    med = statistics.median(r["steps_per_s"] for r in runs)
    steps = args.steps
    each = ", ".join(f"{r['steps_per_s']:.2f}" for r in runs)
    print(f"\nsteps/s (median of {len(runs)}): {med:.2f}  (all: {each})")
    print("client seconds per step (median):")
    for phase in runs[0]["phases"]:
        print(f"  {phase:18s} {statistics.median(r['phases'][phase] for r in runs) / steps:.4f}")
    print("server seconds per step (median): submission->result | inside actors")
    for kind in ("save_weights_for_sampler", "sample", "forward_backward", "optim_step"):
        total = statistics.median(r["server"].get(kind, {}).get("total_s", 0) for r in runs) / steps
        actor = statistics.median(r["server"].get(kind, {}).get("actor_s", 0) for r in runs) / steps
        print(f"  {kind:26s} {total:.4f} | {actor:.4f}")
    print(json.dumps({"args": vars(args), "runs": runs}))


if __name__ == "__main__":
    main()
