"""End to end: Forge's GRPO app against TRL's GRPOTrainer, side by side in one run.

    pip install 'trl==1.16.*'      # the comparison's only extra (accelerate, datasets)
    python -m benchmarks.e2e [--steps 30] [--warmup 3] [--repeats 3] [--sft-steps 150]
                             [--only forge0|forge1|trl|trl1 ...]

About 7-9 minutes with the defaults on the project's 2-core machine (shared, so it varies).

Both frameworks train the same policy on the same task with the same work per optimizer step:

- model: a "mini" tiny model (``make_tiny_model``, ~0.33M parameters) after a short SFT with
  ``apps.sft.main`` (done once, at the start), so that rewards are not all zero;
- task: sum of digits (``apps.sumdigits``), exact-match reward (``sumdigits_reward``);
- per step: ``--prompts`` prompts x ``--group`` completions (TRL: ``num_generations``;
  ``per_device_train_batch_size = prompts*group``, one gradient-accumulation step, so TRL's
  ``generation_batch_size`` is one step's worth and every step generates then trains once),
  ``--max-tokens`` new tokens, temperature 1.0, AdamW at ``--lr``, grad-norm clip 1.0, no KL
  term, eager attention, fp32;
- threads: 2 torch threads in total. Forge runs each actor with ``threads_per_actor=1`` (the
  generator and the trainer are the two busy ones); TRL runs in this process with
  ``torch.set_num_threads(2)``. TRL generates with ``transformers`` ``generate`` (no vLLM).
  TRL also runs a second time with ``torch.set_num_threads(1)`` (row ``trl1``): on a shared
  machine two OpenMP threads in one process can lose far more to contention than they gain
  (see docs/benchmarks.md), so that row shows TRL at its best on this hardware.

Forge keeps every group (``rollout.filter=keep_all``), as TRL does, so both train on exactly
``prompts*group`` completions per step. It runs twice: on-policy (``max_policy_age=0``:
generation and training alternate) and off-by-one (``max_policy_age=1``: the next step's
rollouts are generated while this step trains). Evaluation and checkpoints are off.

Timing: the first ``--warmup`` steps of each run are skipped; seconds/step is the wall time of
the next ``--steps`` steps divided by their number (Forge: the app's ``time/elapsed_s``, the time
between consecutive logged steps; TRL: the time between ``on_step_end`` callbacks); completion
tokens/s counts the completion tokens trained on (EOS included) over the same wall time.
Start-up (process spawn, model load) is excluded on both sides. The configurations are
interleaved in each repetition, and the table shows medians over ``--repeats`` plus the
machine's load average before and after (the machine is shared).

The last line is machine-readable:
``forge_vs_trl_onpolicy=<x> forge_vs_trl_async=<y>`` (TRL at 2 threads, s/step / Forge
s/step: > 1 means Forge is faster); the line before it gives the same ratios against ``trl1``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

TASK_YAML = Path(__file__).resolve().parents[1] / "apps" / "sumdigits" / "cpu.yaml"
LABELS = {
    "forge0": "forge on-policy (age 0)",
    "forge1": "forge off-by-one (age 1)",
    "trl": "trl GRPOTrainer, 2 threads",
    "trl1": "trl GRPOTrainer, 1 thread",
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=3, help="steps skipped at the start of a run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-tokens", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--only", choices=list(LABELS), action="append", help="run only these (repeatable)"
    )
    args = p.parse_args(argv)
    for key in ("steps", "warmup", "repeats"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be >= 1, got {getattr(args, key)}")
    return args


async def prepare_model(workdir: Path, sft_steps: int) -> Path:
    """The "mini" model after ``sft_steps`` of SFT, as in the CPU demo's first stage."""
    from apps.sft.main import Config as SFTConfig
    from apps.sft.main import train as sft_train
    from forge.config import config_from_dict, load_config_dict
    from forge.models import make_tiny_model

    base = make_tiny_model(workdir / "base", preset="mini", seed=0)
    data = load_config_dict(TASK_YAML, [f"sft.model={base}", f"sft.steps={sft_steps}"])["sft"]
    cfg = config_from_dict(SFTConfig, data, source=str(TASK_YAML))
    cfg.output = str(workdir / "sft_model")
    cfg.metrics = []
    (workdir / "sft").mkdir()
    return await sft_train(cfg, workdir / "sft")


# ---------------------------------------------------------------------------------- Forge
def forge_config(model: Path, age: int, args: argparse.Namespace):
    from apps.grpo.main import Config as GRPOConfig
    from forge.config import config_from_dict, load_config_dict

    overrides = [
        f"grpo.model={model}",
        f"grpo.steps={args.warmup + args.steps}",
        f"grpo.max_policy_age={age}",
        f"grpo.rollout.prompts_per_step={args.prompts}",
        f"grpo.rollout.group_size={args.group}",
        f"grpo.rollout.max_tokens={args.max_tokens}",
        "grpo.rollout.filter=keep_all",
        f"grpo.trainer.optimizer.lr={args.lr}",
        "grpo.eval.at_start=false",
        "grpo.eval.at_end=false",
        "grpo.eval.every=0",
        "grpo.metrics=[]",
        "grpo.threads_per_actor=1",
    ]
    data = load_config_dict(TASK_YAML, overrides)["grpo"]
    return config_from_dict(GRPOConfig, data, source=str(TASK_YAML))


async def run_forge(model: Path, age: int, args: argparse.Namespace, run_dir: Path) -> dict:
    from apps.grpo.main import train
    from controller import shutdown

    cfg = forge_config(model, age, args)
    run_dir.mkdir(parents=True)
    try:
        result = await train(cfg, run_dir)
    finally:
        await shutdown()
    steps = [r for r in result["history"] if "time/elapsed_s" in r]
    rows = steps[args.warmup :]
    # time/elapsed_s is the time since the app's metric log started: difference it.
    wall = rows[-1]["time/elapsed_s"] - steps[args.warmup - 1]["time/elapsed_s"]
    tokens = sum(r["train/tokens_per_s"] * r["time/train_s"] for r in rows)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    return {
        "s_per_step": wall / len(rows),
        "tok_per_s": tokens / wall,
        "reward": statistics.fmean(r.get("rollout/reward", float("nan")) for r in rows),
        "wait_batch_s": med("time/wait_batch_s"),
        "train_s": med("time/train_s"),
        "weight_sync_s": med("time/weight_sync_s"),
        "policy_age": med("buffer/sampled_policy_age_mean"),
    }


# ------------------------------------------------------------------------------------ TRL
def trl_reward(prompts, completions, target, **kwargs) -> list[float]:
    """``sumdigits_reward`` in TRL's signature (dataset columns arrive as keyword lists)."""
    from apps.sumdigits.task import sumdigits_reward

    return [sumdigits_reward(p, c, t) for p, c, t in zip(prompts, completions, target)]


def run_trl(model: Path, args: argparse.Namespace, out_dir: Path, seed: int, threads: int) -> dict:
    try:
        from datasets import Dataset
        from transformers import PrinterCallback, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as e:
        raise ImportError("the TRL comparison needs: pip install 'trl==1.16.*'") from e
    import torch

    from apps.sumdigits.task import SumDigits

    total = args.warmup + args.steps
    source = SumDigits(3, 4, seed=2)  # the same prompt stream as Forge's DatasetActor
    rows = [source.sample() for _ in range(args.prompts * (total + 1))]
    per_step = args.prompts * args.group
    cfg = GRPOConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=per_step,  # completions, not prompts
        gradient_accumulation_steps=1,  # -> steps_per_generation=1, generation_batch=per_step
        num_generations=args.group,
        max_completion_length=args.max_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        max_steps=total,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=seed,
        model_init_kwargs={"attn_implementation": "eager", "dtype": "float32"},
    )
    marks: list[float] = []
    lengths: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = GRPOTrainer(
            model=str(model),
            reward_funcs=trl_reward,
            args=cfg,
            train_dataset=Dataset.from_list(rows),
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)  # one dict per step otherwise
        t0 = time.perf_counter()
        trainer.train()
        marks.insert(0, t0)
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    finally:
        torch.set_num_threads(saved_threads)
    span = marks[args.warmup : total + 1]
    wall = span[-1] - span[0]
    tokens = sum(lengths[args.warmup : total]) * per_step
    return {
        "s_per_step": wall / (len(span) - 1),
        "tok_per_s": tokens / wall,
        "reward": statistics.fmean(rewards[args.warmup : total]),
    }


# ----------------------------------------------------------------------------------- main


def report(results: dict[str, list[dict]], load: str) -> None:
    def med(name: str, key: str) -> float:
        vals = [r[key] for r in results.get(name, []) if key in r]
        return statistics.median(vals) if vals else float("nan")

    print(f"\nload average before / after: {load}")
    print(f"{'':28s} {'s/step':>8s} {'tok/s':>8s} {'reward':>7s}  (each: median of runs)")
    for name, label in LABELS.items():
        if name not in results:
            continue
        runs = ", ".join(f"{r['s_per_step']:.3f}" for r in results[name])
        print(
            f"{label:28s} {med(name, 's_per_step'):8.3f} {med(name, 'tok_per_s'):8.0f} "
            f"{med(name, 'reward'):7.3f}  runs s/step: {runs}"
        )
    for name in ("forge0", "forge1"):
        if name in results:
            parts = [med(name, k) for k in ("wait_batch_s", "train_s", "weight_sync_s")]
            rest = med(name, "s_per_step") - sum(parts)
            print(
                f"{LABELS[name]:28s} per step (median s): wait_batch {parts[0]:.3f}  train "
                f"{parts[1]:.3f}  weight_sync {parts[2]:.3f}  rest of loop {rest:.3f}  "
                f"policy_age {med(name, 'policy_age'):.2f}"
            )
    on, off = med("forge0", "s_per_step"), med("forge1", "s_per_step")
    trl1 = med("trl1", "s_per_step")
    print(f"against TRL at 1 thread: on-policy={trl1 / on:.2f} async={trl1 / off:.2f}")
    trl = med("trl", "s_per_step")
    print(f"forge_vs_trl_onpolicy={trl / on:.2f} forge_vs_trl_async={trl / off:.2f}")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def main(args: argparse.Namespace) -> None:
    which = args.only or list(LABELS)
    load_before = loadavg()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="forge-e2e-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        model = await prepare_model(work, args.sft_steps)
        print(f"[e2e] SFT model ready in {time.perf_counter() - t:.0f}s: {model}", flush=True)
        for rep in range(args.repeats):
            for name in which:
                out = work / f"{name}-{rep}"
                if name.startswith("trl"):
                    r = run_trl(model, args, out, seed=rep, threads=1 if name == "trl1" else 2)
                else:
                    r = await run_forge(model, int(name[-1]), args, out)
                results.setdefault(name, []).append(r)
                print(f"[e2e] rep {rep} {LABELS[name]}: {r}", flush=True)
    report(results, f"{load_before} / {loadavg()}")


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
