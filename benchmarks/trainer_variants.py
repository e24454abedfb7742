"""The main job's trainer step in process, in variants: torch.compile, gradient checkpointing.

    python -m benchmarks.trainer_variants                   # every variant, one process each
    python -m benchmarks.trainer_variants --only eager compile_layers

SmolLM2-135M-Instruct (converted once), bf16 autocast as in ``apps/arith/smollm2.yaml``,
2 threads. Each variant runs in a fresh process (its peak RSS is its own): 2 warm-up steps
(the first compiles, where a variant compiles), then the median of ``--steps`` steps.

- ``eager``, ``compile_layers`` (each decoder layer ``compile(dynamic=True)``),
  ``compile_parts`` (only each layer's MLP and RMSNorms): the main job's batch, 8 prompts x 8
  completions of up to 16 sampled tokens (``benchmarks.real_model.sample_batch``).
- ``long``, ``long_gc``, ``long_bf16_head``: a gen-heavy batch, 4 prompts x 8 rows of
  60-128 tokens (random token ids: the cost does not depend on them), as is, with
  ``trainer.gradient_checkpointing``, and with ``trainer.autocast_head`` (the LM head in bf16).
- ``head_ab``: the gen-heavy batch in one process, steps alternating between the float32 head
  and ``autocast_head`` (an A/B that the machine's hour-to-hour speed moves less); reports
  both medians (``median_s`` is the float32 head's, ``bf16_head_median_s`` the other's).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time

VARIANTS = (
    "eager",
    "compile_layers",
    "compile_parts",
    "long",
    "long_gc",
    "long_bf16_head",
    "head_ab",
)


def long_batch(model_dir: str):
    from apps.arith.task import Addition
    from forge.models import load_tokenizer
    from forge.replay import collate_episodes
    from forge.types import Episode

    tok = load_tokenizer(model_dir)
    rng, src, eps = random.Random(0), Addition(seed=5), []
    for g in range(4):
        msgs = src.sample()["prompt"]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        prompt = tok(text if isinstance(msgs, list) else msgs)["input_ids"]
        for j in range(8):
            resp = [rng.randrange(100, 40000) for _ in range(rng.randint(60, 128))]
            eps.append(
                Episode(
                    f"e{g}{j}",
                    list(prompt),
                    resp,
                    [-1.0] * len(resp),
                    reward=0.0,
                    policy_version=0,
                    advantage=1.0 if j % 2 else -1.0,
                )
            )
    return collate_episodes(eps, pad_id=tok.pad_token_id)


def run_variant(variant: str, steps: int) -> dict:
    import torch

    from benchmarks.real_model import sample_batch
    from forge.models.gguf import resolve_model
    from forge.training.trainer_config import TrainerConfig
    from forge.training.trainer_core import TrainerCore

    torch.set_num_threads(2)
    model_dir = resolve_model("smollm2-135m-instruct")
    long = variant.startswith("long") or variant == "head_ab"
    batch = long_batch(model_dir) if long else sample_batch(model_dir)[0]
    cfg = TrainerConfig(
        model=model_dir,
        device="cpu",
        autocast="bfloat16",
        gradient_checkpointing=variant == "long_gc",
        autocast_head=variant == "long_bf16_head",
    )
    core = TrainerCore(cfg)
    if variant.startswith("compile"):
        for layer in core.model.model.layers:
            if variant == "compile_parts":
                for part in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm):
                    part.compile(dynamic=True)
            else:
                layer.compile(dynamic=True)
    if variant == "head_ab":
        return head_ab(core, batch, steps)
    times = []
    for _ in range(2 + steps):
        t = time.perf_counter()
        core.train_step(batch)
        times.append(time.perf_counter() - t)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "variant": variant,
        "first_s": times[0],
        "median_s": statistics.median(times[2:]),
        "steps_s": times[2:],
        "peak_rss_gb": peak_gb,
    }


def head_ab(core, batch, steps: int) -> dict:
    """Alternate the float32 head and the bf16 head (``autocast_head``) step by step."""
    from forge.models.logprobs import set_head_precision

    times: dict[bool, list[float]] = {False: [], True: []}
    for i in range(2 + 2 * steps):
        bf16 = i % 2 == 1
        set_head_precision(core.adapter.model, bf16)
        t = time.perf_counter()
        core.train_step(batch)
        if i >= 2:
            times[bf16].append(time.perf_counter() - t)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"[trainer_variants] float32 head {times[False]}, bf16 head {times[True]}", file=sys.stderr
    )
    return {
        "variant": "head_ab",
        "first_s": 0.0,
        "median_s": statistics.median(times[False]),
        "bf16_head_median_s": statistics.median(times[True]),
        "steps_s": times[False],
        "bf16_head_steps_s": times[True],
        "peak_rss_gb": peak_gb,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(run_variant(args.child, args.steps)), flush=True)
        return []
    rows = []
    for v in args.only:
        print(f"[trainer_variants] {v} ...", flush=True)
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.trainer_variants",
                "--child",
                v,
                "--steps",
                str(args.steps),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if out.returncode != 0:
            raise RuntimeError(f"variant {v} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"\n{'variant':16} {'first step s':>12} {'median s':>9} {'peak RSS GB':>11}")
    for r in rows:
        print(
            f"{r['variant']:16} {r['first_s']:12.1f} {r['median_s']:9.2f} {r['peak_rss_gb']:11.2f}"
        )
        if "bf16_head_median_s" in r:
            print(f"{'  bf16 head':16} {'':12} {r['bf16_head_median_s']:9.2f}")
    return rows


if __name__ == "__main__":
    from controller.malloc import reexec_tuned

    reexec_tuned()  # the malloc settings actor processes run with (FORGE_MALLOC=0: not)
    main()
