"""Multi-turn rollout throughput with and without the hf generator's prefix (KV) reuse.

    python -m benchmarks.multiturn [--episodes 8] [--turns 8] [--max-tokens 16] [--repeats 3]

``--episodes`` concurrent episodes of ``forge.envs.run_episode`` against a ``Generator``
service (hf backend, a tiny model, fp32 on CPU), each inside ``async with svc.session():`` so
that its turns reach one replica. The environment is scripted: it answers every turn with the
same short observation and is never done, so every episode plays ``--turns`` turns of at most
``--max-tokens`` sampled tokens (seeded per episode: the "on" and "off" runs sample the same
tokens, which the benchmark checks). Each turn's prompt is the whole conversation so far.

Compared: ``prefix_cache_tokens`` at its default (reuse on) and 0 (off), with 1 and 2
replicas. For each replica count both services are started, warmed up, then measured in
alternating rounds (``--repeats`` of each, so load from other processes hits both alike);
start-up is excluded. Reported: episodes/s and turns/s (medians over rounds), and the median
latency of one ``generate`` call at turn 1 and at the last turn (over all episodes and
rounds): with reuse the last turn prefills only its new tokens, without it the whole
conversation. The machine's load average is printed, since other processes share the cores.

The last line is machine-readable: ``multiturn_prefix_speedup=<episodes/s with reuse over
episodes/s without, 1 replica>``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from controller import loops, shutdown

OBSERVATION = "ok, go on"


class ScriptedEnv:
    """Answers every turn with ``OBSERVATION``; never done (duck-typed, sync methods)."""

    def reset(self, task):
        return [{"role": "system", "content": "Chat."}, {"role": "user", "content": task}]

    def step(self, action: str):
        from forge import StepResult

        return StepResult(OBSERVATION, reward=0.0)


async def one_round(svc, tok, args, episodes: int, turns: int) -> dict:
    """``episodes`` concurrent episodes; wall time, per-turn latencies and trajectories."""
    from forge.envs import run_episode

    latencies: dict[int, list[float]] = {}

    async def episode(i: int):
        calls = 0

        async def generate(prompt_ids, **sampling):
            nonlocal calls
            calls += 1
            t = time.perf_counter()
            out = await svc.generate.route(prompt_ids, **sampling)
            latencies.setdefault(calls, []).append(time.perf_counter() - t)
            return out

        sampling = {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": 1000 + i}
        async with svc.session():
            return await run_episode(
                ScriptedEnv(),
                f"Task {i}: say something.",
                generate,
                tok,
                max_turns=turns,
                max_context_tokens=args.max_context,
                sampling=sampling,
            )

    t = time.perf_counter()
    trajs = await asyncio.gather(*(episode(i) for i in range(episodes)))
    return {"seconds": time.perf_counter() - t, "latencies": latencies, "trajs": trajs}


async def bench_replicas(model_dir: str, replicas: int, args) -> dict[str, dict]:
    from forge import Generator, GeneratorConfig, load_tokenizer

    tok = load_tokenizer(model_dir)
    services = {}
    for name, tokens in (("on", GeneratorConfig.prefix_cache_tokens), ("off", 0)):
        cfg = GeneratorConfig(
            model=model_dir,
            device=args.device,
            max_batch_size=args.max_batch_size,
            prefix_cache_tokens=tokens,
        )
        services[name] = await Generator.options(num_replicas=replicas).as_service(cfg)
    for svc in services.values():  # warm-up: first-call allocations
        await one_round(svc, tok, args, episodes=2, turns=2)
    rounds: dict[str, list[dict]] = {"on": [], "off": []}
    for r in range(args.repeats):
        for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
            rounds[name].append(
                await one_round(services[name], tok, args, args.episodes, args.turns)
            )
    same = all(
        [t.token_ids for t in a["trajs"]] == [t.token_ids for t in b["trajs"]]
        for a, b in zip(rounds["on"], rounds["off"])
    )
    out = {}
    for name, rs in rounds.items():
        stats = await services[name].stats.fanout()
        out[name] = summarize(rs, args, stats, same)
        await services[name].shutdown()
    return out


def summarize(rounds: list[dict], args, stats: list[dict], same: bool) -> dict:
    trajs = [t for r in rounds for t in r["trajs"]]
    turns = [sum(t.num_turns for t in r["trajs"]) for r in rounds]

    def latency(turn: int) -> float:
        return statistics.median(x for r in rounds for x in r["latencies"].get(turn, [])) * 1e3

    return {
        "episodes_per_s": statistics.median(args.episodes / r["seconds"] for r in rounds),
        "turns_per_s": statistics.median(n / r["seconds"] for n, r in zip(turns, rounds)),
        "seconds": [r["seconds"] for r in rounds],
        "first_ms": latency(1),
        "last_ms": latency(args.turns),
        "mean_tokens": statistics.mean(len(t.token_ids) for t in trajs),
        "full_episodes": sum(t.num_turns == args.turns for t in trajs) / len(trajs),
        "hits": sum(s.get("prefix_hits", 0) for s in stats),
        "reused": sum(s.get("prefix_reused_tokens", 0) for s in stats),
        "prefilled": sum(s.get("prefill_tokens", 0) for s in stats),
        "same_tokens": same,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-context", type=int, default=512, help="the tiny models' length")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--preset", default="small", help="forge.models.PRESETS")
    ap.add_argument("--device", default="cpu", help="the generators' torch device")
    args = ap.parse_args()

    from forge import make_tiny_model

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    results: dict[int, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="forge-bench-multiturn-") as tmp:
        make_tiny_model(tmp, preset=args.preset)
        for replicas in (int(x) for x in args.replicas.split(",")):

            async def run(replicas=replicas):
                try:
                    return await bench_replicas(tmp, replicas, args)
                finally:
                    await shutdown()

            results[replicas] = loops.run(run())

    print(
        f"{args.episodes} concurrent episodes x {args.turns} turns, max_tokens {args.max_tokens}"
        f" per turn, temperature 1.0, '{args.preset}' tiny model fp32 on {args.device}, "
        f"medians of {args.repeats} rounds (on/off interleaved)"
    )
    print(
        f"load average before {', '.join(f'{x:.1f}' for x in load_before)}; after "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; {os.cpu_count()} cores; "
        f"total {time.perf_counter() - t0:.0f} s"
    )
    header = (
        f"{'replicas':>8} {'reuse':>5} {'episodes/s':>10} {'turns/s':>8} {'turn1 ms':>9} "
        f"{f'turn{args.turns} ms':>9} {'hits':>5} {'reused tok':>10} {'prefill tok':>11}"
    )
    print(header)
    for replicas, by_mode in results.items():
        for name, r in by_mode.items():
            print(
                f"{replicas:>8} {name:>5} {r['episodes_per_s']:>10.2f} {r['turns_per_s']:>8.1f} "
                f"{r['first_ms']:>9.0f} {r['last_ms']:>9.0f} {r['hits']:>5} "
                f"{r['reused']:>10} {r['prefilled']:>11}"
            )
    for replicas, by_mode in results.items():
        on = by_mode["on"]
        print(
            f"{replicas} replica(s): round seconds on {_fmt(on['seconds'])}, off "
            f"{_fmt(by_mode['off']['seconds'])}; mean episode length {on['mean_tokens']:.0f} "
            f"tokens; full-length episodes {on['full_episodes']:.0%}; same tokens on/off: "
            f"{on['same_tokens']}"
        )
    one = results.get(1) or next(iter(results.values()))
    print(
        f"multiturn_prefix_speedup={one['on']['episodes_per_s'] / one['off']['episodes_per_s']:.2f}"
    )


def _fmt(xs: list[float]) -> str:
    return ", ".join(f"{x:.1f}" for x in xs)


if __name__ == "__main__":
    main()
