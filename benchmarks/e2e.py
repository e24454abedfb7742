"""End to end: Forge's GRPO app against TRL's GRPOTrainer, side by side in one run.

    pip install 'trl==1.16.*'      # the comparison's only extra (accelerate, datasets)
    python -m benchmarks.e2e [--config short|gen-heavy|both] [--repeats 3] [--steps 30]
                             [--gen-steps 8] [--only forge0|forge1|trl1|trl2 ...]

About 16 minutes with the defaults on the project's 2-core machine at load 2-5 (it varies).

Two configurations. Both: sum of digits (``apps.sumdigits``) with the exact-match reward
(``sumdigits_reward``), ``--group`` completions per prompt, temperature 1.0, AdamW at ``--lr``,
grad-norm clip 1.0, no KL term, fp32, no vLLM; every optimizer step trains on exactly one
step's worth of completions (TRL: ``per_device_train_batch_size = prompts*group``, one
gradient-accumulation step, so ``generation_batch_size`` is one step and every step
generates then trains once; Forge: ``rollout.filter=keep_all``, so no group is dropped).

- ``short``: the "mini" tiny model (~0.33M parameters) after ``--sft-steps`` of SFT
  (``apps.sft``, done once at the start) so that rewards are not all zero; ``--prompts``
  prompts per step, at most ``--max-tokens`` (6) new tokens. Training and generation cost
  about the same; a step is a fraction of a second.
- ``gen-heavy``: closer to LLM RL, where generation dominates the step: the "small" preset
  (4 layers, hidden 256) at its random initialisation, ``--gen-prompts`` prompts per step,
  at most 64 new tokens. No SFT: SFT teaches a model to answer in two tokens and stop, which
  is the opposite of generation-heavy; the untrained policy samples nearly uniformly over
  its byte vocabulary, so completions mostly run to the 64-token cap (the table shows the
  mean length; the generator has no minimum-length knob). Its rewards are ~0, so advantages
  are ~0 and the policy barely moves: this configuration measures throughput, not learning.
  Both frameworks still run the full forward and backward on every completion.

Systems, per configuration and repetition:

- ``forge0``: Forge on-policy (``max_policy_age=0``: generation and training alternate);
  ``forge1``: off-by-one (``max_policy_age=1``: the next step's rollouts are generated while
  this step trains). Threads: the app's own ``threads_per_actor`` setting unless
  ``--forge-threads`` overrides it (the generator and the trainer are the busy actors).
  Evaluation and checkpoints are off.
- ``trl1``, ``trl2``: TRL in this process with ``torch.set_num_threads(1)`` and ``(2)``,
  generating with ``transformers`` ``generate``; ``use_cpu``, fp32, no gradient
  checkpointing, eager attention, no ``torch.compile`` (``--trl-attn``/``--trl-compile``
  change that; eager and no compile were the fastest here, see docs/benchmarks.md).
- ``trl best``: per repetition, the faster of ``trl1`` and ``trl2``. On a shared 2-core
  machine two OpenMP threads in one process can lose more waiting for a descheduled thread
  than they gain, so TRL's best thread count depends on the load; the ratios use this row.

Timing: the first ``--warmup`` (gen-heavy: ``--gen-warmup``) steps of each run are skipped;
s/step is the wall time of the next ``--steps`` (``--gen-steps``) steps over their number,
between the ends of steps (Forge: when the app logs a step; TRL: ``on_step_end``). Completion
tokens/s counts the completion tokens trained on (EOS included) over the same time. Start-up
(process spawn, model load) is excluded. Runs are interleaved within each repetition; the
table shows medians over ``--repeats``.

CPU utilisation: CPU seconds (user + system) of this process and all its descendants (Forge's
actor processes are its children; TRL runs in this process), sampled every 0.2 s
(``benchmarks.common.ProcessTreeCpu``) and interpolated at the timed window's ends, over the
window's wall time x the cores this process may run on (``os.sched_getaffinity``): 100% means every core busy with this run's work.
The sampler itself costs ~2 ms of CPU per sample (~1% of one core). Load average: the 1-minute
load before and after each run (the machine is shared; it includes this benchmark).

The last lines are machine-readable, TRL-best s/step over Forge s/step (> 1: Forge faster):
``gen_heavy_forge_vs_trl_onpolicy=<x> gen_heavy_forge_vs_trl_async=<y>`` and, last,
``forge_vs_trl_onpolicy=<x> forge_vs_trl_async=<y>`` for the short configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ProcessTreeCpu, utilisation
from controller import loops

TASK_YAML = Path(__file__).resolve().parents[1] / "apps" / "sumdigits" / "cpu.yaml"
SYSTEMS = {
    "forge0": "forge on-policy (age 0)",
    "forge1": "forge off-by-one (age 1)",
    "trl1": "trl, 1 thread",
    "trl2": "trl, 2 threads",
}
BEST = "trl_best"
LABELS = {**SYSTEMS, BEST: "trl best of 1|2 threads"}
CONFIGS = ("short", "gen-heavy")
CORES = len(os.sched_getaffinity(0))  # os.cpu_count(), less any cores this process may not use


@dataclass(frozen=True)
class Setup:
    """One configuration: the model and the work per step."""

    name: str
    preset: str
    sft_steps: int  # 0: train from the preset's random initialisation
    prompts: int
    group: int
    max_tokens: int
    warmup: int
    steps: int
    lr: float

    @property
    def prefix(self) -> str:
        """Key prefix of this configuration's machine-readable line."""
        return "" if self.name == "short" else self.name.replace("-", "_") + "_"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=[*CONFIGS, "both"], default="both")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=30, help="short: measured steps per run")
    p.add_argument("--warmup", type=int, default=3, help="short: steps skipped per run")
    p.add_argument("--sft-steps", type=int, default=150, help="short: SFT steps of the model")
    p.add_argument("--prompts", type=int, default=16, help="short: prompts per step")
    p.add_argument("--max-tokens", type=int, default=6, help="short: max new tokens")
    p.add_argument("--gen-steps", type=int, default=8, help="gen-heavy: measured steps per run")
    p.add_argument("--gen-warmup", type=int, default=2, help="gen-heavy: steps skipped per run")
    p.add_argument("--gen-prompts", type=int, default=4, help="gen-heavy: prompts per step")
    p.add_argument("--gen-max-tokens", type=int, default=64, help="gen-heavy: max new tokens")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--forge-threads",
        type=int,
        default=None,
        help="Forge: rl.threads_per_actor (default: the app's own default)",
    )
    p.add_argument("--trl-attn", choices=["eager", "sdpa"], default="eager")
    p.add_argument("--trl-compile", action="store_true", help="TRL: torch_compile=True")
    p.add_argument(
        "--only", choices=list(SYSTEMS), action="append", help="run only these (repeatable)"
    )
    args = p.parse_args(argv)
    for key in ("steps", "warmup", "repeats", "gen_steps", "gen_warmup", "prompts", "group"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    return args


def setups(args: argparse.Namespace) -> list[Setup]:
    """The configurations to run, in the order they run and report."""
    short = Setup(
        "short",
        "mini",
        args.sft_steps,
        args.prompts,
        args.group,
        args.max_tokens,
        args.warmup,
        args.steps,
        args.lr,
    )
    gen = Setup(
        "gen-heavy",
        "small",
        0,
        args.gen_prompts,
        args.group,
        args.gen_max_tokens,
        args.gen_warmup,
        args.gen_steps,
        args.lr,
    )
    return {"short": [short], "gen-heavy": [gen], "both": [short, gen]}[args.config]


async def prepare_model(workdir: Path, setup: Setup) -> Path:
    """The preset's model, after ``setup.sft_steps`` of SFT on the task (as in the CPU demo)."""
    from forge import make_tiny_model, run_stage
    from forge.launch import load_app

    base = make_tiny_model(workdir / "base", preset=setup.preset, seed=0)
    if not setup.sft_steps:
        return base
    _, demo = load_app(TASK_YAML, [f"sft.policy.model={base}", f"sft.steps={setup.sft_steps}"])
    demo.sft.output = str(workdir / "sft_model")
    demo.sft.metrics = []
    return (await run_stage(demo.sft, workdir / "sft", resume=False))["model"]


def window(marks: list[float], samples: list, warmup: int, steps: int) -> dict:
    """s/step and CPU utilisation of the timed steps. ``marks[i]`` is when step ``i`` ended
    (``marks[0]``: when step 1 began), so the window runs from the end of the last warm-up
    step to the end of the last step."""
    if len(marks) < warmup + steps + 1:
        raise RuntimeError(f"expected {warmup + steps + 1} step marks, got {len(marks)}")
    t0, t1 = marks[warmup], marks[warmup + steps]
    return {
        "wall": t1 - t0,
        "s_per_step": (t1 - t0) / steps,
        "cpu_util": utilisation(samples, t0, t1, CORES),
    }


# ---------------------------------------------------------------------------------- Forge
def forge_config(model: Path, age: int, setup: Setup, threads: int | None = None):
    """The demo's RL stage (``rl:`` of ``apps/sumdigits/cpu.yaml``) for this setup."""
    from forge.launch import load_app

    overrides = [
        f"rl.policy.model={model}",
        f"rl.steps={setup.warmup + setup.steps}",
        f"rl.max_policy_age={age}",
        f"rl.rollout.prompts_per_step={setup.prompts}",
        f"rl.rollout.group_size={setup.group}",
        f"rl.rollout.max_tokens={setup.max_tokens}",
        "rl.rollout.filter=keep_all",
        f"rl.trainer.optimizer.lr={setup.lr}",
        "rl.eval.at_start=false",
        "rl.eval.at_end=false",
        "rl.eval.every=0",
        "rl.metrics=[]",
    ]
    if threads is not None:
        overrides.append(f"rl.threads_per_actor={threads}")
    return load_app(TASK_YAML, overrides)[1].rl


@contextlib.contextmanager
def step_clock(app, marks: list[float]):
    """Append ``perf_counter()`` each time the GRPO app (module ``app``) logs a step. The
    app's own ``time/elapsed_s`` is relative to an origin the benchmark cannot see, and the
    CPU samples need absolute times; this wraps the app's ``MetricLog.step`` for the run."""
    base = app.MetricLog

    class ClockedLog(base):
        def step(self, step, metrics):
            out = super().step(step, metrics)
            marks.append(time.perf_counter())
            return out

    app.MetricLog = ClockedLog
    try:
        yield
    finally:
        app.MetricLog = base


async def run_forge(
    model: Path, age: int, setup: Setup, run_dir: Path, threads: int | None = None
) -> dict:
    from controller import shutdown
    from forge import M
    from forge.launch import app_module

    cfg = forge_config(model, age, setup, threads)
    app = app_module(cfg.app, str(TASK_YAML), needs=("stage", "MetricLog"))
    run_dir.mkdir(parents=True)
    marks: list[float] = []
    with ProcessTreeCpu(interval=0.2) as cpu, step_clock(app, marks):
        try:
            result = await app.stage(cfg, run_dir, resume=False)
        finally:
            await shutdown()
    rows = [r for r in result["history"] if M.ELAPSED_S in r][setup.warmup :]
    # marks[i] = end of step i+1; prepend a placeholder so marks[i] = end of step i.
    w = window([math.nan, *marks], cpu.samples, setup.warmup, setup.steps)
    tokens = sum(r[M.train("tokens")] for r in rows)
    # The loop's time outside wait_batch + train + weight_sync (metrics, bookkeeping).
    ends = marks[setup.warmup - 1 :]
    rest = [b - a - r[M.STEP_S] for a, b, r in zip(ends, ends[1:], rows)]

    def med(key: str) -> float:  # (a row may lack a metric that arrives a step late)
        return statistics.median(r[key] for r in rows if key in r)

    return {
        "s_per_step": w["s_per_step"],
        "tok_per_s": tokens / w["wall"],
        # (a step that no scored group reached before it was logged has no reward)
        "reward": statistics.fmean(r[M.REWARD] for r in rows if M.REWARD in r),
        "completion_len": tokens / (len(rows) * setup.prompts * setup.group),
        "cpu_util": w["cpu_util"],
        "wait_batch_s": med(M.WAIT_BATCH_S),
        "train_s": med(M.TRAIN_S),
        "weight_sync_s": med(M.WEIGHT_SYNC_S),
        "rest_s": statistics.median(rest),
        "policy_age": med(M.POLICY_AGE_MEAN),
    }


# ------------------------------------------------------------------------------------ TRL
def trl_reward(prompts, completions, target, **kwargs) -> list[float]:
    """``sumdigits_reward`` in TRL's signature (dataset columns arrive as keyword lists)."""
    from apps.sumdigits.task import sumdigits_reward

    return [sumdigits_reward(p, c, t) for p, c, t in zip(prompts, completions, target)]


def trl_config(setup: Setup, out_dir: Path, seed: int, args: argparse.Namespace):
    return cpu_grpo_config(
        out_dir,
        prompts=setup.prompts,
        group=setup.group,
        max_tokens=setup.max_tokens,
        lr=setup.lr,
        steps=setup.warmup + setup.steps,
        seed=seed,
        attn=args.trl_attn,
        torch_compile=args.trl_compile,
    )


def cpu_grpo_config(
    out_dir: Path,
    *,
    prompts: int,
    group: int,
    max_tokens: int,
    lr: float,
    steps: int,
    seed: int,
    attn: str = "eager",
    **extra,
):
    """TRL's ``GRPOConfig`` as these comparisons run it: CPU, fp32, no KL, constant lr,
    grad-norm clip 1.0, one generation batch (``prompts * group`` completions) per optimizer
    step, no checkpoints or reports; ``extra`` adds or overrides fields."""
    from trl import GRPOConfig

    fields = dict(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=prompts * group,  # completions, not prompts
        gradient_accumulation_steps=1,  # -> steps_per_generation=1, generation_batch=per_step
        num_generations=group,
        max_completion_length=max_tokens,
        temperature=1.0,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=seed,
        model_init_kwargs={"attn_implementation": attn, "dtype": "float32"},
    )
    return GRPOConfig(**{**fields, **extra})


def trl_clock(marks: list[float], lengths: list[float]) -> type:
    """A TRL ``TrainerCallback`` class that appends ``perf_counter()`` to ``marks`` at the end
    of every step and each logged ``completions/mean_length`` to ``lengths``."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    return Clock


def run_trl(model: Path, setup: Setup, out_dir: Path, seed: int, threads: int, args) -> dict:
    try:
        from datasets import Dataset
        from transformers import PrinterCallback
        from trl import GRPOTrainer
    except ImportError as e:
        raise ImportError("the TRL comparison needs: pip install 'trl==1.16.*'") from e
    import torch

    from apps.sumdigits.task import SumDigits

    total = setup.warmup + setup.steps
    source = SumDigits(3, 4, seed=2)  # the same prompt stream as Forge's DatasetActor
    rows = [source.sample() for _ in range(setup.prompts * (total + 1))]
    marks: list[float] = []
    lengths: list[float] = []
    Clock = trl_clock(marks, lengths)
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = GRPOTrainer(
            model=str(model),
            reward_funcs=trl_reward,
            args=trl_config(setup, out_dir, seed, args),
            train_dataset=Dataset.from_list(rows),
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)  # one dict per step otherwise
        with ProcessTreeCpu(interval=0.2) as cpu:
            marks.append(time.perf_counter())
            trainer.train()
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    finally:
        torch.set_num_threads(saved_threads)
    w = window(marks, cpu.samples, setup.warmup, setup.steps)
    timed = lengths[setup.warmup : total]
    return {
        "s_per_step": w["s_per_step"],
        "tok_per_s": sum(timed) * setup.prompts * setup.group / w["wall"],
        "reward": statistics.fmean(rewards[setup.warmup : total]),
        "completion_len": statistics.fmean(timed),
        "cpu_util": w["cpu_util"],
        "threads": threads,
    }


# -------------------------------------------------------------------------------- report
def best_of_threads(by_threads: dict[int, list[dict]]) -> list[dict]:
    """Per repetition, the TRL run with the lowest s/step over the thread counts run (each
    list is one thread count's runs, in repetition order)."""
    runs = [rs for rs in by_threads.values() if rs]
    return [min(rep, key=lambda r: r["s_per_step"]) for rep in zip(*runs)]


def median(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs if key in r]
    return statistics.median(vals) if vals else math.nan


def ratios(by_system: dict[str, list[dict]]) -> tuple[float, float]:
    """TRL-best median s/step over Forge's, on-policy and off-by-one (NaN where not run)."""
    trl = median(by_system.get(BEST, []), "s_per_step")
    on = median(by_system.get("forge0", []), "s_per_step")
    off = median(by_system.get("forge1", []), "s_per_step")
    return trl / on, trl / off


def table_lines(name: str, by_system: dict[str, list[dict]]) -> list[str]:
    """One configuration's rows of the table and the Forge per-step breakdown."""
    lines = []
    for system, label in LABELS.items():
        runs = by_system.get(system)
        if not runs:
            continue
        each = ", ".join(
            f"{r['s_per_step']:.3f}" + (f"({r['threads']}t)" if system == BEST else "")
            for r in runs
        )
        load = f"{median(runs, 'load_before'):.1f}>{median(runs, 'load_after'):.1f}"
        lines.append(
            f"{name:9s} {label:25s} {median(runs, 's_per_step'):7.3f} "
            f"{median(runs, 'tok_per_s'):7.0f} {median(runs, 'reward'):6.3f} "
            f"{median(runs, 'completion_len'):5.1f} {100 * median(runs, 'cpu_util'):5.0f}% "
            f"{load:>9s}  {each}"
        )
    for system in ("forge0", "forge1"):
        runs = by_system.get(system)
        if not runs:
            continue
        parts = [median(runs, k) for k in ("wait_batch_s", "train_s", "weight_sync_s")]
        rest = median(runs, "rest_s")
        lines.append(
            f"{name:9s} {LABELS[system]:25s} per step (median s): wait_batch {parts[0]:.3f}  "
            f"train {parts[1]:.3f}  weight_sync {parts[2]:.3f}  rest {rest:.3f}  "
            f"policy_age {median(runs, 'policy_age'):.2f}"
        )
    return lines


def report_lines(results: dict[str, dict[str, list[dict]]], order: list[Setup]) -> list[str]:
    """The whole report; the machine-readable lines come last, the short configuration's
    ``forge_vs_trl_onpolicy=<x> forge_vs_trl_async=<y>`` the very last."""
    head = (
        f"{'config':9s} {'system':25s} {'s/step':>7s} {'tok/s':>7s} {'reward':>6s} "
        f"{'len':>5s} {'CPU':>6s} {'load':>9s}  runs s/step"
    )
    lines = ["", f"medians over repetitions; CPU = utilisation of {CORES} cores", head]
    for setup in order:
        lines += table_lines(setup.name, results.get(setup.name, {}))
    tail = sorted(order, key=lambda s: s.name == "short")  # the short configuration last
    for setup in tail:
        on, off = ratios(results.get(setup.name, {}))
        p = setup.prefix
        lines.append(f"{p}forge_vs_trl_onpolicy={on:.2f} {p}forge_vs_trl_async={off:.2f}")
    return lines


# ----------------------------------------------------------------------------------- main
async def run_one(system: str, model: Path, setup: Setup, out: Path, rep: int, args) -> dict:
    load_before = os.getloadavg()[0]
    if system.startswith("trl"):
        r = run_trl(model, setup, out, seed=rep, threads=int(system[-1]), args=args)
    else:
        r = await run_forge(model, int(system[-1]), setup, out, args.forge_threads)
    return {**r, "load_before": load_before, "load_after": os.getloadavg()[0]}


async def main(args: argparse.Namespace) -> None:
    which = args.only or list(SYSTEMS)
    order = setups(args)
    results: dict[str, dict[str, list[dict]]] = {s.name: {} for s in order}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="forge-e2e-") as tmp:
        work = Path(tmp)
        models = {}
        for setup in order:
            (work / setup.name).mkdir()
            models[setup.name] = await prepare_model(work / setup.name, setup)
            print(
                f"[e2e] {setup.name}: model ready at {time.perf_counter() - start:.0f}s", flush=True
            )
        for rep in range(args.repeats):
            for setup in order:
                by_system = results[setup.name]
                for system in which:
                    out = work / setup.name / f"{system}-{rep}"
                    r = await run_one(system, models[setup.name], setup, out, rep, args)
                    by_system.setdefault(system, []).append(r)
                    print(
                        f"[e2e] rep {rep + 1}/{args.repeats} {setup.name} {system}: "
                        f"{r['s_per_step']:.3f} s/step, {r['tok_per_s']:.0f} tok/s, "
                        f"len {r['completion_len']:.1f}, CPU {100 * r['cpu_util']:.0f}%, "
                        f"load {r['load_before']:.1f}>{r['load_after']:.1f} "
                        f"(at {time.perf_counter() - start:.0f}s)",
                        flush=True,
                    )
        for by_system in results.values():
            trl = {int(s[-1]): by_system[s] for s in ("trl1", "trl2") if s in by_system}
            if trl:
                by_system[BEST] = best_of_threads(trl)
    print("\n".join(report_lines(results, order)))


if __name__ == "__main__":
    loops.run(main(parse_args()))
