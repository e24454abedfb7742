"""Held-out accuracy after equal steps: Forge's main job against TRL's GRPOTrainer.

    pip install 'trl==1.16.*'
    python -m benchmarks.real_heldout [--config short|gen-heavy] [--steps 30] [--seeds 0 1]
                                      [--only forge forge_set trl_bf16 trl_fp32]
                                      [--forge-set KEY=VALUE ...]

Each system trains SmolLM2-135M-Instruct for ``--steps`` steps on the same stream of prompts
(``benchmarks.real_e2e``'s setups and settings: Forge's main job as shipped, ``forge_set`` the
same with the ``--forge-set`` overrides, TRL 1.16 in bf16 or float32; ``seed=N`` picks the
stream and both systems' seeds). Then the base model and each final model are evaluated the
same way, by ``forge eval``'s machinery: greedy answers from the main job's generator (in the
precision ``auto`` picks) to the task's 200 held-out pairs, asked with the setup's
instruction and at most its new tokens, scored by ``correct`` (what both trained on),
``contains`` (the sum anywhere) and ``strict`` (only the number). The last line is
machine-readable: ``heldout_<config>_<system>=<mean after>`` for each system.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.real_e2e import MAIN_YAML, SETUPS, Setup, release_memory, run_forge, run_trl
from controller import loops

SYSTEMS = ("forge", "forge_set", "trl_bf16", "trl_fp32")


def eval_overrides(model: str, setup: Setup) -> list[str]:
    """The main job's config, pointed at ``model``, asking ``setup``'s way."""
    out = [
        f"base_model={model}",
        f"rl.policy.model={model}",
        f"rl.eval.max_tokens={setup.max_tokens}",
        "rl.metrics=[]",
    ]
    if setup.instruction:
        out.append("rl.data.fn=benchmarks.real_e2e:LongAddition")
    return out


async def evaluate(model: str, setup: Setup) -> dict[str, float]:
    """``{"correct", "contains", "strict"}``: greedy held-out accuracy of ``model``."""
    from controller import shutdown
    from forge.cli.eval import choose_sets, rl_section, run_eval
    from forge.launch import load_app

    rl = rl_section(load_app(MAIN_YAML, eval_overrides(model, setup))[1])
    try:
        res = await run_eval(rl, choose_sets(rl, None))
    finally:
        await shutdown()
    # each set's mean 0/1 reward; "heldout" is scored by the run's reward, ``correct``
    return {("correct" if name == "heldout" else name): m["reward"] for name, m in res.items()}


async def main(args: argparse.Namespace) -> None:
    from forge.models.gguf import resolve_model

    base = str(resolve_model("smollm2-135m-instruct"))
    setup = SETUPS[args.config]
    start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[real_heldout] {msg} (at {time.perf_counter() - start:.0f}s)", flush=True)

    before = await evaluate(base, setup)
    say(f"{setup.name} base model: {fmt(before)}")
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="forge-real-heldout-") as tmp:
        for seed in args.seeds:
            for system in args.only:
                out = Path(tmp) / f"{system}-{seed}"
                t0 = time.perf_counter()
                if system in ("forge", "forge_set"):
                    extra = tuple(args.forge_set) if system == "forge_set" else ()
                    raw = await run_forge(base, setup, args.steps, out, (f"seed={seed}", *extra))
                    model = str(raw["model"])
                else:
                    model = str(out / "model")
                    raw = run_trl(
                        base,
                        setup,
                        args.steps,
                        out,
                        bf16=system == "trl_bf16",
                        seed=seed,
                        save=Path(model),
                    )
                    release_memory()
                minutes = (time.perf_counter() - t0) / 60
                step_s = median_step(raw["marks"][1:])  # [0]: the start (TRL), NaN (Forge)
                after = await evaluate(model, setup)
                rows.setdefault(system, []).append({**after, "minutes": minutes, "step_s": step_s})
                say(
                    f"{setup.name} {system} seed {seed}: {args.steps} steps in {minutes:.1f} "
                    f"min (median step {step_s:.1f} s); held-out {fmt(after)}; training "
                    f"reward by step {' '.join(f'{r:.2f}' for r in raw['rewards'])}"
                )
    print(f"\n{setup.name}: base {fmt(before)}; after {args.steps} steps, seeds {args.seeds}:")
    for system, runs in rows.items():
        each = ", ".join(f"{r['correct']:.3f}" for r in runs)
        mean = {k: statistics.mean(r[k] for r in runs) for k in before}
        print(
            f"  {system:9s} correct {mean['correct']:.3f} ({each})  contains "
            f"{mean['contains']:.3f}  strict {mean['strict']:.3f}  "
            f"train {statistics.median(r['minutes'] for r in runs):.1f} min, median step "
            f"{statistics.median(r['step_s'] for r in runs):.1f} s"
        )
    key = setup.name.replace("-", "_")
    print(
        " ".join(
            f"heldout_{key}_{s}={statistics.mean(r['correct'] for r in runs):.3f}"
            for s, runs in rows.items()
        )
    )


def median_step(marks: list[float]) -> float:
    """The median time between the ends of consecutive steps (``marks``: each step's end)."""
    return statistics.median(b - a for a, b in zip(marks, marks[1:]))


def fmt(scores: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.3f}" for k, v in scores.items())


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=list(SETUPS), default="short")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--only", nargs="+", choices=SYSTEMS, default=["forge", "trl_bf16"])
    p.add_argument(
        "--forge-set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides of the main job for the forge_set system",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    from controller.malloc import reexec_tuned

    reexec_tuned()  # TRL runs in this process, with the malloc settings (as benchmarks.real_e2e)
    loops.run(main(parse_args()))
