"""The bf16 decode path in variants (contiguous KV, the sampler's CDF), in one process, interleaved.

    python -m benchmarks.decode_variants [--repeats 4] [--max-tokens 128]

SmolLM2-135M-Instruct (converted once) in bf16, Forge's ``HFEngine`` alone (no actor), 2
threads, the gen-heavy batch: 4 prompts x 8 samples, ``--max-tokens`` sampled each
(``ignore_eos``). Variants: ``base`` (attention over the KV cache's views, a float64 cumsum
over the whole vocabulary per sampled token), ``contig``: decode attention over contiguous
copies of those views (``forge.generation.attention.CONTIGUOUS_DECODE``), and ``engine``:
``contig`` plus the two-level inverse CDF (``forge.generation.sampling.inverse_cdf``), what
the engine does.

Prints each repetition's wall and process CPU seconds, then medians per variant, and whether
every variant sampled the same tokens as ``base`` (the changes keep the values).
"""

from __future__ import annotations

import argparse
import statistics
import time

VARIANTS = {"base": (False, False), "contig": (True, False), "engine": (True, True)}  # KV, CDF


def flat_inverse_cdf(probs_bv, uniforms_b):
    """The sampler's draw before ``inverse_cdf``: a float64 cumsum over the whole row."""
    import torch

    cdf_bv = probs_bv.cumsum(-1, dtype=torch.float64)
    target_b1 = uniforms_b.unsqueeze(1) * cdf_bv[:, -1:]
    token_b = torch.searchsorted(cdf_bv, target_b1, right=True).squeeze(1)
    return token_b.clamp_(max=probs_bv.shape[1] - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()

    import torch

    from forge.generation import attention, sampling
    from forge.generation.hf_engine import HFEngine
    from forge.models import load_model, load_tokenizer
    from forge.models.gguf import resolve_model
    from forge.types import SamplingParams

    torch.set_num_threads(2)
    model_dir = resolve_model("smollm2-135m-instruct")
    engine = HFEngine(
        load_model(model_dir, dtype="bfloat16"), load_tokenizer(model_dir), max_batch_size=80
    )
    pairs = [(13, 90), (45, 27), (68, 11), (99, 99)]
    prompts = [
        [
            {
                "role": "user",
                "content": f"What is {a} + {b}? Think step by step, then give the answer.",
            }
        ]
        for a, b in pairs
    ]
    params = SamplingParams(n=8, max_tokens=args.max_tokens, ignore_eos=True, seed=1)

    two_level = sampling.inverse_cdf

    def run(variant: tuple[bool, bool]) -> tuple[float, float, list]:
        attention.CONTIGUOUS_DECODE = variant[0]
        sampling.inverse_cdf = two_level if variant[1] else flat_inverse_cdf
        wall, cpu = time.perf_counter(), time.process_time()
        out = engine.generate([(p, params) for p in prompts])
        tokens = [c.token_ids for cs in out for c in cs]
        return time.perf_counter() - wall, time.process_time() - cpu, tokens

    run(VARIANTS["engine"])  # warm-up
    results: dict[str, list] = {v: [] for v in VARIANTS}
    for rep in range(args.repeats):
        for name, variant in VARIANTS.items():
            wall, cpu, tokens = run(variant)
            results[name].append((wall, cpu, tokens))
            print(f"[decode] rep {rep + 1} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", flush=True)
    n = 32 * args.max_tokens
    base = results["base"][0][2]
    print(f"{'variant':8s} {'wall s':>7s} {'CPU s':>7s} {'tok/s':>6s}  same tokens as base")
    for name, rs in results.items():
        wall = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        same = all(r[2] == base for r in rs)
        print(f"{name:8s} {wall:7.2f} {cpu:7.2f} {n / wall:6.0f}  {same}")


if __name__ == "__main__":
    from controller.malloc import reexec_tuned

    reexec_tuned()  # the malloc settings actor processes run with (FORGE_MALLOC=0: not)
    main()
