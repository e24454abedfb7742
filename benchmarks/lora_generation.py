"""LoRA on the hf generator: ``merged`` vs ``unmerged`` (``GeneratorConfig.lora_mode``).

    python -m benchmarks.lora_generation [--presets tiny mini small] [--rank 8] [--repeats 3]

For each tiny-model preset, an ``HFBackend`` in this process (no actors) gets LoRA adapter
versions pushed the way a LoRA trainer pushes them (``TrainerCore.push_state_dict``: rank
``--rank`` on every q/k/v/o/gate/up/down projection, random ``B`` so the update is not
zero) and then generates a batch: ``--prompts`` concurrent ``generate`` calls with ``--n``
samples each, ``--max-tokens`` tokens, temperature 1.0, fixed seeds. Reported per mode and
preset: generation tokens/s (median of ``--repeats`` batches after one warm-up) and the
``update_weights`` time of one adapter version (median over ``--repeats`` versions; the
first version, which also sets the model up, is reported apart). ``multi`` is
``lora_mode: multi``: two adapters loaded with ``load_adapter`` (alternate versions) and every
batch half one adapter, half the other (per-row LoRA). ``base`` is the same model
with no adapter at all. Torch runs with ``--threads`` threads (default 1: a quiet number on a
shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = [f"Sum the digits of {n}." for n in (4821, 93, 7, 123456, 505, 8888, 61, 2024)]


def _adapter_versions(model: str, rank: int, count: int) -> list[dict]:
    from forge.training import TrainerConfig, TrainerCore
    from forge.training.trainer_config import LoraConfig

    core = TrainerCore(TrainerConfig(model=model, lora=LoraConfig(rank=rank)))
    out = []
    for v in range(count):
        with torch.no_grad():
            for name, p in core.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(v))
        out.append({k: t.clone() for k, t in core.push_state_dict().items()})
    return out


async def _batch(backend, args, multi: bool = False) -> float:
    from forge.types import SamplingParams

    t0 = time.perf_counter()
    calls = [
        backend.generate(
            PROMPTS[i % len(PROMPTS)],
            SamplingParams(n=args.n, max_tokens=args.max_tokens, seed=i),
            **({"adapter": "ab"[i % 2]} if multi else {}),
        )
        for i in range(args.prompts)
    ]
    results = await asyncio.gather(*calls)
    tokens = sum(len(c.token_ids) for r in results for c in r)
    return tokens / (time.perf_counter() - t0)


async def _measure(model: str, mode: str, versions: list[dict], args) -> dict:
    from forge.generation.backend import GeneratorConfig
    from forge.generation.hf_backend import HFBackend

    backend = HFBackend(
        GeneratorConfig(
            model=model,
            lora_mode=mode if mode != "base" else "merged",
            max_batch_size=args.prompts * args.n,
        )
    )
    await backend.start()
    try:
        first = updates = float("nan")
        if mode != "base":
            times = []
            for v, sd in enumerate(versions, start=1):
                t0 = time.perf_counter()
                if mode == "multi":  # two adapters, "a" and "b", each its own versions
                    await backend.load_adapter("ab"[v % 2], v, sd)
                else:
                    await backend.update_weights(sd, v, "in_flight")
                times.append(time.perf_counter() - t0)
            first, updates = times[0], statistics.median(times[1:])
        multi = mode == "multi"
        await _batch(backend, args, multi)  # warm-up
        speeds = [await _batch(backend, args, multi) for _ in range(args.repeats)]
        return {
            "tokens_per_s": statistics.median(speeds),
            "first_update_s": first,
            "update_s": updates,
        }
    finally:
        await backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "mini", "small"])
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from forge.models import make_tiny_model

    print(f"{'preset':8} {'mode':9} {'tokens/s':>9} {'1st update ms':>14} {'update ms':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            model = str(make_tiny_model(Path(tmp) / preset, preset=preset, seed=0))
            versions = _adapter_versions(model, args.rank, args.repeats + 1)
            for mode in ("base", "merged", "unmerged", "multi"):
                r = asyncio.run(_measure(model, mode, versions, args))
                print(
                    f"{preset:8} {mode:9} {r['tokens_per_s']:9.1f} "
                    f"{r['first_update_s'] * 1e3:14.2f} {r['update_s'] * 1e3:10.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
