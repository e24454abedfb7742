"""The real model end to end: Forge's main job against TRL's GRPOTrainer, side by side.

    pip install 'trl==1.16.*'
    python -m benchmarks.real_e2e [--config short|gen-heavy|both] [--repeats 3] [--steps 3]
                                  [--warmup 2] [--only forge trl_fp32 trl_bf16 ...]
                                  [--forge-set KEY=VALUE ...]

SmolLM2-135M-Instruct (``smollm2-135m-instruct``, converted once) on 2-digit addition asked in
chat (``apps.arith``), 8 prompts x 8 completions, temperature 1.0, AdamW lr 1e-5, grad-norm
clip 1.0, no KL term, one optimizer step per generation batch.

- ``short``: "Answer with just the number.", at most 16 new tokens (the main job's shape).
- ``gen-heavy``: "Think step by step, then give the answer.", at most 128 new tokens, 4 x 8.

Systems, each run in turn within a repetition:

- ``forge``: ``apps/arith/smollm2.yaml`` as shipped (on-policy, ``max_policy_age: 0``;
  precision ``auto``: a bf16 generator and bf16-autocast trainer on a CPU with native bf16,
  float32 on one without), evaluation off. Its trainer skips the rows
  whose advantage is exactly 0 (groups whose 8 samples got the same reward; their gradient
  is 0, TRL computes them): each line says what share of the timed steps' rows that was.
- ``trl_fp32``, ``trl_bf16``: TRL 1.16 in this process with 2 torch threads, ``use_cpu``,
  generating with transformers ``generate``; ``bf16=False`` / ``True`` (accelerate's CPU bf16
  autocast). No gradient checkpointing, eager attention, no compile: the fastest TRL settings
  on this machine for the toy model (``benchmarks.e2e``). vLLM is not an option for TRL on
  this CPU (its colocate and server modes need CUDA).
- ``trl_best``: per repetition, the faster TRL run.
- ``forge_set``: Forge with the overrides given by ``--forge-set`` on top (an A/B of one knob
  against ``forge`` in the same repetitions), e.g. ``--only forge forge_set --forge-set
  rl.trainer.weights.dtype=bfloat16``.

Both systems run with the glibc malloc settings of Forge's actor processes
(``controller.malloc``: this process starts itself again with them, and TRL runs in it);
``FORGE_MALLOC=0`` runs both on glibc's defaults.

s/step is the wall time of ``--steps`` steps after ``--warmup`` warm-up steps (start-up and model
load excluded), medians over repetitions. The last line is machine-readable:
``real_forge_vs_trl=<x>`` (short) and ``real_gen_heavy_forge_vs_trl=<y>``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ProcessTreeCpu
from benchmarks.e2e import cpu_grpo_config, step_clock, trl_clock, window
from controller import loops

MAIN_YAML = Path(__file__).resolve().parents[1] / "apps" / "arith" / "smollm2.yaml"
SYSTEMS = ("forge", "forge_set", "trl_fp32", "trl_bf16")
LONG = "Think step by step, then give the answer."


@dataclass(frozen=True)
class Setup:
    name: str
    prompts: int
    group: int
    max_tokens: int
    instruction: str | None  # None: the task's own ("Answer with just the number.")

    def rows(self, n: int, seed: int) -> list[dict]:
        from apps.arith.task import INSTRUCTION, Addition

        source, out = Addition(seed=seed), []
        for _ in range(n):
            row = source.sample()
            if self.instruction:
                text = row["prompt"][0]["content"].replace(INSTRUCTION, self.instruction)
                row = {**row, "prompt": [{"role": "user", "content": text}]}
            out.append(row)
        return out


SETUPS = {
    "short": Setup("short", 8, 8, 16, None),
    "gen-heavy": Setup("gen-heavy", 4, 8, 128, LONG),
}


class LongAddition:
    """``apps.arith.task.Addition`` asking for the working (the gen-heavy prompts)."""

    def __init__(self, seed: int = 0, **kw):
        self._rows, self._setup = [], SETUPS["gen-heavy"]
        self._seed = seed

    def sample(self) -> dict:
        if not self._rows:
            self._rows = self._setup.rows(256, self._seed)[::-1]
            self._seed += 1
        return self._rows.pop()

    def heldout(self) -> list[dict]:
        """The task's 200 held-out pairs (never drawn for training) with the long instruction
        (``benchmarks.real_heldout`` evaluates on them)."""
        from apps.arith.task import INSTRUCTION, Addition

        return [
            {
                **row,
                "prompt": [
                    {
                        "role": "user",
                        "content": row["prompt"][0]["content"].replace(INSTRUCTION, LONG),
                    }
                ],
            }
            for row in Addition().heldout()
        ]

    def state_dict(self) -> dict:
        return {"seed": self._seed, "rows": list(self._rows)}

    def load_state_dict(self, state: dict) -> None:
        self._seed, self._rows = state["seed"], list(state["rows"])


def release_memory() -> None:
    """Collect TRL's objects and return the freed heap to the OS (glibc ``malloc_trim``).
    Without it this process kept ~10.8 GB after a gen-heavy TRL run, and the next Forge run's
    trainer was killed by the kernel's OOM killer on the 24 GiB machine."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: nothing to trim
        pass


async def run_forge(
    model: str, setup: Setup, steps: int, run_dir: Path, extra: tuple[str, ...] = ()
) -> dict:
    from controller import shutdown
    from forge import M
    from forge.launch import app_module, load_app

    overrides = [
        f"base_model={model}",
        f"rl.policy.model={model}",
        f"rl.steps={steps}",
        f"rl.rollout.prompts_per_step={setup.prompts}",
        f"rl.rollout.group_size={setup.group}",
        f"rl.rollout.max_tokens={setup.max_tokens}",
        "rl.rollout.filter=keep_all",  # every step trains on one generation batch, as TRL
        "rl.eval.at_start=false",
        "rl.eval.at_end=false",
        "rl.eval.every=0",
        "rl.metrics=[]",
    ]
    if setup.instruction:
        overrides.append("rl.data.fn=benchmarks.real_e2e:LongAddition")
    overrides += extra
    cfg = load_app(MAIN_YAML, overrides)[1].rl
    app = app_module(cfg.app, str(MAIN_YAML), needs=("stage", "MetricLog"))
    run_dir.mkdir(parents=True)
    marks: list[float] = []
    with ProcessTreeCpu(interval=0.2) as cpu, step_clock(app, marks):
        try:
            result = await app.stage(cfg, run_dir, resume=False)
        finally:
            await shutdown()
    rows = [r for r in result["history"] if M.ELAPSED_S in r]
    return {
        "marks": [math.nan, *marks],
        "samples": cpu.samples,
        "tokens": [r[M.train("tokens")] for r in rows],
        # rows whose advantage was exactly 0, not computed (trainer.skip_zero_advantage)
        "skipped": [r.get(M.train("rows_skipped"), 0.0) for r in rows],
        "train_s": statistics.median(r[M.TRAIN_S] for r in rows),
        "rewards": [r.get(M.REWARD, math.nan) for r in rows],  # each step's mean reward
        "model": result["model"],
    }


def run_trl(
    model: str,
    setup: Setup,
    steps: int,
    out_dir: Path,
    bf16: bool,
    seed: int = 0,
    save: Path | None = None,
) -> dict:
    """TRL's GRPOTrainer on ``setup``'s prompts (``seed``'s stream, as Forge's ``seed=``);
    ``save``: where the final model and tokenizer go."""
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    from apps.arith.task import correct

    def reward(prompts, completions, target, **kw) -> list[float]:
        return [correct(p, c[-1]["content"], t) for p, c, t in zip(prompts, completions, target)]

    marks: list[float] = []
    lengths: list[float] = []
    Clock = trl_clock(marks, lengths)
    torch.set_num_threads(2)
    args = cpu_grpo_config(
        out_dir,
        prompts=setup.prompts,
        group=setup.group,
        max_tokens=setup.max_tokens,
        lr=1e-5,
        steps=steps,
        seed=seed,
        bf16=bf16,
    )
    rows = setup.rows(setup.prompts * (steps + 1), seed=seed)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        callbacks=[Clock()],
    )
    trainer.remove_callback(PrinterCallback)
    with ProcessTreeCpu(interval=0.2) as cpu:
        marks.append(time.perf_counter())
        trainer.train()
    if save is not None:
        trainer.save_model(str(save))
        trainer.processing_class.save_pretrained(str(save))
    n = setup.prompts * setup.group
    rewards = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    return {
        "marks": marks,
        "samples": cpu.samples,
        "tokens": [x * n for x in lengths],
        "rewards": rewards,
    }


def timed(raw: dict, warmup: int, steps: int, setup: Setup) -> dict:
    w = window(raw["marks"], raw["samples"], warmup, steps)
    tokens = raw["tokens"][warmup : warmup + steps]
    rows = steps * setup.prompts * setup.group
    skipped = sum(raw.get("skipped", [])[warmup : warmup + steps]) / rows
    return {
        "s_per_step": w["s_per_step"],
        "tok_per_s": sum(tokens) / w["wall"],
        "completion_len": sum(tokens) / (len(tokens) * setup.prompts * setup.group),
        "cpu_util": w["cpu_util"],
        **({"train_s": raw["train_s"]} if "train_s" in raw else {}),
        **({"skipped_rows": skipped} if "skipped" in raw else {}),
    }


def med(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else math.nan


async def main(args: argparse.Namespace) -> None:
    from forge.models.gguf import resolve_model

    model = str(resolve_model("smollm2-135m-instruct"))
    order = [SETUPS[c] for c in (SETUPS if args.config == "both" else [args.config])]
    which = args.only or [s for s in SYSTEMS if s != "forge_set"]
    results: dict[str, dict[str, list[dict]]] = {s.name: {} for s in order}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="forge-real-e2e-") as tmp:
        for rep in range(args.repeats):
            for setup in order:
                for system in which:
                    out = Path(tmp) / f"{setup.name}-{system}-{rep}"
                    load = os.getloadavg()[0]
                    total = args.warmup + args.steps
                    if system in ("forge", "forge_set"):
                        extra = tuple(args.forge_set) if system == "forge_set" else ()
                        raw = await run_forge(model, setup, total, out, extra)
                    else:
                        raw = run_trl(model, setup, total, out, bf16=system == "trl_bf16")
                        release_memory()  # TRL ran in this process: give its heap back
                    r = {**timed(raw, args.warmup, args.steps, setup), "load": load}
                    results[setup.name].setdefault(system, []).append(r)
                    print(
                        f"[real_e2e] rep {rep + 1} {setup.name} {system}: "
                        f"{r['s_per_step']:.2f} s/step, {r['tok_per_s']:.0f} tok/s, "
                        f"len {r['completion_len']:.1f}, CPU {100 * r['cpu_util']:.0f}%, "
                        f"skipped {100 * r.get('skipped_rows', 0.0):.0f}% of rows, "
                        f"load {load:.1f} (at {time.perf_counter() - start:.0f}s)",
                        flush=True,
                    )
    print(
        f"\n{'config':9s} {'system':9s} {'s/step':>7s} {'tok/s':>6s} {'len':>5s} {'CPU':>5s}  runs"
    )
    ratios = {}
    for setup in order:
        by = results[setup.name]
        trl = [by[s] for s in ("trl_fp32", "trl_bf16") if s in by]
        if trl:
            by["trl_best"] = [min(rep, key=lambda r: r["s_per_step"]) for rep in zip(*trl)]
        for system, runs in by.items():
            each = ", ".join(f"{r['s_per_step']:.2f}" for r in runs)
            print(
                f"{setup.name:9s} {system:9s} {med(runs, 's_per_step'):7.2f} "
                f"{med(runs, 'tok_per_s'):6.0f} {med(runs, 'completion_len'):5.1f} "
                f"{100 * med(runs, 'cpu_util'):4.0f}%  {each}"
            )
        if "forge" in by and "trl_best" in by:
            ratios[setup.name] = med(by["trl_best"], "s_per_step") / med(by["forge"], "s_per_step")
    print(
        " ".join(
            f"real_{'' if k == 'short' else 'gen_heavy_'}forge_vs_trl={v:.2f}"
            for k, v in sorted(ratios.items(), reverse=True)
        )
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=[*SETUPS, "both"], default="short")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--only", nargs="+", choices=SYSTEMS)
    p.add_argument(
        "--forge-set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for the forge_set system",
    )
    args = p.parse_args(argv)
    if ("forge_set" in (args.only or ())) != bool(args.forge_set):
        p.error("--forge-set needs forge_set in --only, and forge_set needs --forge-set")
    return args


if __name__ == "__main__":
    from controller.malloc import reexec_tuned

    # TRL runs in this process: it gets the malloc settings Forge's actors get (with them its
    # gen-heavy step took 28% less time, 2026-11-28); FORGE_MALLOC=0: glibc's defaults for both.
    reexec_tuned()
    loops.run(main(parse_args()))
