"""The Tinker RL loop against ``forge serve``: steps per second, and where a step's time goes.

    python -m benchmarks.tinker_loop [--steps 20] [--repeats 3] [--group 8] [--prompts 4]

Starts ``forge serve`` (the tiny CPU model), then per repeat creates a LoRA training client
with the ``tinker`` SDK and runs ``--steps`` steps of apps/tinker/rl_loop.py's loop: save the
weights for sampling, sample ``--prompts`` x ``--group`` completions of 12 tokens,
importance-sampling ``forward_backward``, ``optim_step`` (waited for). Reported: steps/s
(median over repeats), the client's seconds per step in each phase, and the server's split
of the same calls (``GET /forge/v1/stats``): seconds inside Forge's trainer and generator
actors against seconds from the request's arrival to its result. The client's time minus the
server's is HTTP, the SDK's polling of futures and (de)serialisation.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

KEY = "tml-bench"


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "forge.cli", "serve", "--port", "0", "--api-key", KEY],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if m := re.search(r"Tinker API on (http://\S+)", line):
            return proc, m.group(1)
        if not line:
            break
    proc.kill()
    raise RuntimeError("forge serve did not start")


def one_run(url: str, steps: int, group: int, prompts: int) -> dict:
    import numpy as np
    import tinker
    from tinker import types

    from apps.tinker.rl_loop import PROMPTS, datum, reward

    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    training = service.create_lora_training_client(base_model="forge/tiny", rank=8).result()
    tok = training.get_tokenizer()
    params = types.SamplingParams(max_tokens=12, temperature=1.0)
    phases = {"save_for_sampler": 0.0, "sample": 0.0, "train": 0.0}
    rewards = []
    t_start = time.perf_counter()
    for step in range(steps):
        t0 = time.perf_counter()
        sampler = training.save_weights_and_get_sampling_client(name=f"b{step}").result()
        t1 = time.perf_counter()
        ps = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(prompts)]
        futs = [sampler.sample(types.ModelInput.from_ints(p), group, params) for p in ps]
        data, rs = [], []
        for p, f in zip(ps, futs):
            seqs = f.result().sequences
            r = np.array([reward(tok.decode(s.tokens, skip_special_tokens=True)) for s in seqs])
            adv = (r - r.mean()) / (r.std() + 1e-6)
            rs += list(r)
            data += [datum(p, s, float(a)) for s, a in zip(seqs, adv) if a != 0]
        t2 = time.perf_counter()
        if data:
            training.forward_backward(data, "importance_sampling")
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        t3 = time.perf_counter()
        phases["save_for_sampler"] += t1 - t0
        phases["sample"] += t2 - t1
        phases["train"] += t3 - t2
        rewards.append(float(np.mean(rs)))
    wall = time.perf_counter() - t_start
    return {"steps_per_s": steps / wall, "wall_s": wall, "phases": phases,
            "reward_first": rewards[0], "reward_last": rewards[-1]}  # fmt: skip


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
    p.add_argument("--prompts", type=int, default=4)
    args = p.parse_args()
    proc, url = start_server()
    try:
        runs = []
        for r in range(args.repeats):
            before = server_stats(url)
            run = one_run(url, args.steps, args.group, args.prompts)
            after = server_stats(url)
            run["server"] = {
                k: {f: v[f] - before.get(k, {}).get(f, 0) for f in ("n", "total_s", "actor_s")}
                for k, v in after.items()
            }
            runs.append(run)
            print(f"[tinker_loop] repeat {r}: {run['steps_per_s']:.2f} steps/s, reward "
                  f"{run['reward_first']:.2f} -> {run['reward_last']:.2f}", flush=True)  # fmt: skip
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
