"""The machine's limit and each role's distance from it, on the real model (SmolLM2-135M).

    python -m benchmarks.real_model [--threads 2] [--repeats 3] [--out results.json]
                                    [--dtypes float32 bfloat16]

1. **Ceiling**: torch matmul FLOP/s at the model's GEMM shapes (tokens x 576 against the
   q/k/v/o, gate/up/down and LM-head weights), float32 and bfloat16.
2. **Trainer**: one GRPO step of the main job's shape (8 prompts x 8 completions sampled by the
   model itself), float32 and bf16 autocast (eager attention; bf16 also with SDPA): seconds, and FLOPs counted as 6 x (non-embedding
   parameters) x (token positions the step runs, a group's shared prompt once) + 6 x head
   FLOPs on the scored positions, plus attention, over the ceiling of the same precision.
3. **Generator**: prefill and decode tokens/s at batch 1, 8 and 64 (bf16 and float32), and
   decode against its roofline (weights read once per step: bytes / read bandwidth, and
   FLOPs / matmul ceiling, whichever binds). The read bandwidth is a float32 sum over 512 MB
   (a copy's read + write bytes are printed beside it; on the project's machine both ~24 GB/s).

Prints a markdown table (docs/performance.md "Where the time goes on the real model"). Runs
with the glibc malloc settings actor processes get (``controller.malloc``; ``FORGE_MALLOC=0``:
glibc's defaults, as before 2026-11-28 evening). ``--dtypes`` defaults to both where the CPU
multiplies bf16 natively (``forge.models.precision``) and to float32 alone elsewhere (there a
bf16 matmul runs ~100x slower, and this benchmark would take hours).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

HIDDEN, INTER, KV, VOCAB, LAYERS = 576, 1536, 192, 49152, 30


def gemm_ceiling(dtype: torch.dtype, tokens: int, repeats: int) -> float:
    """Median FLOP/s over the model's GEMMs at ``tokens`` rows (each shape weighted by its
    FLOPs in a forward)."""
    shapes = [
        (HIDDEN, HIDDEN),
        (HIDDEN, KV),
        (HIDDEN, KV),
        (HIDDEN, HIDDEN),
        (HIDDEN, INTER),
        (HIDDEN, INTER),
        (INTER, HIDDEN),
    ]
    flops, seconds = 0.0, 0.0
    for k, n in shapes:
        a, b = torch.randn(tokens, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            for _ in range(5):
                a @ b
            times.append((time.perf_counter() - t) / 5)
        flops += 2 * tokens * k * n
        seconds += statistics.median(times)
    return flops / seconds


def memory_bandwidth() -> tuple[float, float]:
    """Bytes/s read by a sum over 512 MB (what a decode step does with the weights), and
    bytes/s moved by a copy of 256 MB (read + write counted), medians of 5."""
    x = torch.empty(128 * 2**20, dtype=torch.float32).uniform_()
    y = torch.empty(64 * 2**20, dtype=torch.float32)
    read, copy = [], []
    for _ in range(6):
        t = time.perf_counter()
        x.sum()
        read.append(x.numel() * 4 / (time.perf_counter() - t))
        t = time.perf_counter()
        y.copy_(x[: y.numel()])
        copy.append(2 * y.numel() * 4 / (time.perf_counter() - t))
    return statistics.median(read[1:]), statistics.median(copy[1:])


def sample_batch(model_dir: str, dtype: str = "bfloat16"):
    from apps.arith.task import Addition
    from forge.generation.hf_engine import HFEngine
    from forge.models import load_model, load_tokenizer
    from forge.replay import collate_episodes
    from forge.types import Episode, SamplingParams

    tok = load_tokenizer(model_dir)
    src = Addition(seed=5)
    items = [src.sample() for _ in range(8)]
    engine = HFEngine(load_model(model_dir, dtype=dtype), tok, max_batch_size=64, seed=0)
    params = SamplingParams(n=8, max_tokens=16, temperature=1.0)
    outs = engine.generate([(it["prompt"], params) for it in items])
    eps = [
        Episode(
            f"e{i}",
            c.prompt_ids,
            c.token_ids,
            c.logprobs,
            reward=0.0,
            policy_version=0,
            advantage=1.0 if i % 2 else -1.0,
        )
        for i, c in enumerate(c for cs in outs for c in cs)
    ]
    prompt_len = len(outs[0][0].prompt_ids)
    return collate_episodes(eps, pad_id=tok.pad_token_id), prompt_len, len(items)


def trainer_flops(batch, prompt_len: int, groups: int, non_embedding: int) -> float:
    """FLOPs of one training step (forward + backward = 3 x forward): the shared prompts once
    per group, every completion's positions, the head on the scored positions."""
    scored = float(batch.response_mask_bt.sum())
    positions = groups * prompt_len + scored
    attn = 2 * 2 * LAYERS * HIDDEN * positions * (prompt_len + 16)  # QK^T and AV, rough
    return 3 * (2 * non_embedding * positions + 2 * HIDDEN * VOCAB * scored + attn)


def time_trainer(
    model_dir: str, batch, autocast: str | None, repeats: int, attn: str = "eager"
) -> float:
    from forge.training.trainer_config import TrainerConfig
    from forge.training.trainer_core import TrainerCore

    cfg = TrainerConfig(model=model_dir, device="cpu", autocast=autocast, attn_implementation=attn)
    core = TrainerCore(cfg)
    core.train_step(batch)  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        core.train_step(batch)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile_trainer(model_dir: str) -> dict:
    """One bf16-autocast trainer step under ``torch.profiler``: the ops that take the time."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from forge.training.trainer_config import TrainerConfig
    from forge.training.trainer_core import TrainerCore

    batch, _, _ = sample_batch(model_dir)
    core = TrainerCore(TrainerConfig(model=model_dir, device="cpu", autocast="bfloat16"))
    core.train_step(batch)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("train_step"):
        core.train_step(batch)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    return {}


def time_generation(model_dir: str, dtype: str, batch: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s) for ``batch`` distinct prompts, 32 new tokens."""
    from apps.arith.task import Addition
    from forge.generation.hf_engine import HFEngine
    from forge.models import load_model, load_tokenizer
    from forge.types import SamplingParams

    tok = load_tokenizer(model_dir)
    engine = HFEngine(load_model(model_dir, dtype=dtype), tok, max_batch_size=batch, seed=0)
    items = Addition(seed=7).heldout()[:batch]
    one = SamplingParams(max_tokens=1, temperature=0.0)
    many = SamplingParams(max_tokens=33, temperature=1.0, ignore_eos=True)
    engine.generate([(it["prompt"], one) for it in items])  # warm-up
    t = time.perf_counter()
    engine.generate([(it["prompt"], one) for it in items])
    prefill_s = time.perf_counter() - t
    prompt_tokens = engine.counters["prefill_tokens"] / 2
    t = time.perf_counter()
    engine.generate([(it["prompt"], many) for it in items])
    decode_s = time.perf_counter() - t - prefill_s
    return prompt_tokens / prefill_s, batch * 32 / max(decode_s, 1e-9)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="")
    p.add_argument(
        "--profile",
        action="store_true",
        help="only profile one bf16-autocast trainer step (torch.profiler, top ops)",
    )
    p.add_argument(
        "--dtypes",
        nargs="+",
        choices=["float32", "bfloat16"],
        default=None,
        help="precisions to measure (default: bfloat16 too where it is native)",
    )
    args = p.parse_args(argv)
    if args.dtypes is None:
        from forge.models.precision import native_bf16

        args.dtypes = ["float32", "bfloat16"] if native_bf16("cpu") else ["float32"]
    torch.set_num_threads(args.threads)
    from forge.models import load_model
    from forge.models.gguf import resolve_model

    model_dir = resolve_model("smollm2-135m-instruct")
    if args.profile:
        return profile_trainer(str(model_dir))
    model = load_model(model_dir)
    non_embedding = sum(p.numel() for p in model.parameters()) - VOCAB * HIDDEN
    del model
    read, copy = memory_bandwidth()
    r: dict = {"threads": args.threads, "bandwidth_gbs": read / 1e9, "copy_gbs": copy / 1e9}
    for name in args.dtypes:
        r[f"ceiling_{name}_gflops"] = gemm_ceiling(getattr(torch, name), 1024, args.repeats) / 1e9
    batch, prompt_len, groups = sample_batch(model_dir)
    flops = trainer_flops(batch, prompt_len, groups, non_embedding)
    r["trainer_step_tflop"] = flops / 1e12
    for name in args.dtypes:
        s = time_trainer(model_dir, batch, None if name == "float32" else name, args.repeats)
        r[f"trainer_{name}_s"] = s
        r[f"trainer_{name}_share"] = flops / s / 1e9 / r[f"ceiling_{name}_gflops"]
    if "bfloat16" in args.dtypes:
        s = time_trainer(model_dir, batch, "bfloat16", args.repeats, attn="sdpa")
        r["trainer_bfloat16_sdpa_s"] = s
        r["trainer_bfloat16_sdpa_share"] = flops / s / 1e9 / r["ceiling_bfloat16_gflops"]
    for dtype in args.dtypes[::-1]:
        for b in (1, 8, 64):
            pre, dec = time_generation(model_dir, dtype, b)
            r[f"gen_{dtype}_b{b}_prefill_tps"], r[f"gen_{dtype}_b{b}_decode_tps"] = pre, dec
            bytes_step = (non_embedding + VOCAB * HIDDEN) * (2 if dtype == "bfloat16" else 4)
            ceiling = r[f"ceiling_{dtype}_gflops"] * 1e9
            step_s = max(
                bytes_step / (r["bandwidth_gbs"] * 1e9),
                2 * (non_embedding + VOCAB * HIDDEN) * b / ceiling,
            )
            r[f"gen_{dtype}_b{b}_roofline_tps"] = b / step_s
    print(json.dumps(r, indent=1))
    print(table(r))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1)
    return r


def table(r: dict) -> str:
    """The markdown table; a precision that was not measured (``--dtypes``) shows "-"."""

    def c(key: str, spec: str = ".0f", around: str = "{}") -> str:
        return around.format(format(r[key], spec)) if key in r else "-"

    def both(stem: str, spec: str = ".0f") -> str:
        return f"{c(stem.format('float32'), spec)} | {c(stem.format('bfloat16'), spec)} |"

    rows = ["| what | float32 | bfloat16 |", "| --- | --- | --- |"]
    rows.append(
        f"| matmul ceiling at the model's shapes, {r['threads']} threads (GFLOP/s) | "
        + both("ceiling_{}_gflops")
    )
    rows.append(
        f"| trainer step, 64 rows ({r['trainer_step_tflop']:.2f} TFLOP), s | "
        + both("trainer_{}_s", ".2f")
    )
    rows.append("| trainer share of the ceiling | " + both("trainer_{}_share", ".0%"))
    rows.append(
        "| trainer step with SDPA attention, s (share) | | "
        + (
            f"{c('trainer_bfloat16_sdpa_s', '.2f')} "
            f"{c('trainer_bfloat16_sdpa_share', '.0%', '({})')} |"
            if "trainer_bfloat16_sdpa_s" in r
            else "- |"
        )
    )
    for b in (1, 8, 64):
        dec = [
            f"{c(f'gen_{d}_b{b}_decode_tps')} {c(f'gen_{d}_b{b}_roofline_tps', '.0f', '({})')}"
            if f"gen_{d}_b{b}_decode_tps" in r
            else "-"
            for d in ("float32", "bfloat16")
        ]
        rows.append(f"| decode tokens/s at batch {b} (roofline) | {dec[0]} | {dec[1]} |")
        rows.append(f"| prefill tokens/s at batch {b} | " + both(f"gen_{{}}_b{b}_prefill_tps"))
    rows.append(
        f"| memory bandwidth, read (copy: read + write), GB/s | {r['bandwidth_gbs']:.1f} "
        f"({r.get('copy_gbs', 0.0):.1f}) | |"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    from controller.malloc import reexec_tuned

    reexec_tuned()  # the malloc settings actor processes run with (FORGE_MALLOC=0: not)
    main()
