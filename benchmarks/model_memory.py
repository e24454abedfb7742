"""Peak memory per role on the real models (docs/models.md, "Memory per role").

    python -m benchmarks.model_memory [--models smollm2-135m-instruct gemma3-270m]
                                      [--new-tokens 16 128] [--rows 64] [--group 8]
                                      [--roles generator trainer]

Each measurement runs in a fresh process (its peak resident set, ``ru_maxrss``, is the
role's): the **generator** loads the model at the precision ``auto`` picks here and samples
``rows`` completions of ``new-tokens`` tokens (``ignore_eos``) for ``rows / group`` prompts;
the **trainer** loads it as the main job's trainer does (float32 weights, AdamW, bf16
autocast where the CPU has native bf16) and takes two GRPO steps on such a batch (every row a
nonzero advantage, so none is skipped). Prints a markdown table: model, role, new tokens, peak
GiB, seconds.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

PROMPT = "Question: What is {a} plus {b}? Think it through, then give the answer.\nAnswer:"


def _generator(model: str, rows: int, group: int, new: int) -> None:
    from forge.generation import HFEngine
    from forge.models import load_model, load_tokenizer
    from forge.models.precision import resolve_auto
    from forge.types import SamplingParams

    dtype = resolve_auto("generator.dtype", "auto", "cpu", warn=False) or "float32"
    engine = HFEngine(load_model(model, dtype), load_tokenizer(model), max_batch_size=rows)
    params = SamplingParams(n=group, max_tokens=new, ignore_eos=True, seed=0)
    engine.generate([(PROMPT.format(a=i, b=i + 1), params) for i in range(rows // group)])


def _trainer(model: str, rows: int, group: int, new: int) -> None:
    import random

    from forge.models import load_tokenizer
    from forge.models.precision import resolve_auto
    from forge.replay import collate_episodes
    from forge.training import OptimizerConfig, TrainerConfig, TrainerCore
    from forge.types import Episode

    native = resolve_auto("trainer.autocast", "auto", "cpu", warn=False) == "bfloat16"
    cfg = TrainerConfig(
        model=model,
        autocast="bfloat16" if native else None,
        optimizer=OptimizerConfig(lr=1e-6),
    )
    core, tok, rng = TrainerCore(cfg), load_tokenizer(model), random.Random(0)
    vocab = len(tok)
    for step in range(2):
        episodes = []
        for i in range(rows):
            prompt = tok(PROMPT.format(a=i // group, b=step))["input_ids"]
            response = [rng.randrange(vocab) for _ in range(new)]
            advantage = 1.0 if i % 2 else -1.0
            episodes.append(
                Episode(f"e{i}", prompt, response, [-1.0] * new, 0.0, 0, advantage=advantage)
            )
        core.train_step(collate_episodes(episodes, pad_id=tok.pad_token_id))


def _measure(role: str, model: str, rows: int, group: int, new: int) -> dict:
    t0 = time.perf_counter()
    {"generator": _generator, "trainer": _trainer}[role](model, rows, group, new)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"seconds": time.perf_counter() - t0, "peak_gib": peak_gib}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "gemma3-270m"])
    p.add_argument("--new-tokens", nargs="+", type=int, default=[16, 128])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--roles", nargs="+", default=["generator", "trainer"])
    p.add_argument("--one", nargs=3, metavar=("ROLE", "MODEL", "NEW"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:  # a child: one measurement, as JSON on the last line
        role, model, new = args.one
        print(json.dumps(_measure(role, model, args.rows, args.group, int(new))))
        return
    print(
        f"| model | role | new tokens | peak GiB | seconds |  ({args.rows} rows, groups of "
        f"{args.group})"
    )
    print("| --- | --- | --- | --- | --- |")
    for model in args.models:
        for new in args.new_tokens:
            for role in args.roles:
                cmd = [
                    sys.executable,
                    "-m",
                    "benchmarks.model_memory",
                    "--one",
                    role,
                    model,
                    str(new),
                    "--rows",
                    str(args.rows),
                    "--group",
                    str(args.group),
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(
                    f"| {model} | {role} | {new} | {r['peak_gib']:.2f} | {r['seconds']:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
