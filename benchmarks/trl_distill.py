"""Self-distillation against a peer: Forge's on-policy self-distillation and TRL 1.16's
``SDFTTrainer``, side by side on the real model.

    pip install 'trl==1.16.*'
    python -m benchmarks.trl_distill [--steps 10] [--warmup 2] [--seed 0] [--only forge trl]

The student is SmolLM2-135M-Instruct (``smollm2-135m-instruct``, converted once); the task is
``apps.arith.task.Subtraction`` (2-digit subtraction asked in chat, half the answers negative; greedy
held-out accuracy about 0.05 at the start). The teacher is, in both systems, the student's own
starting weights, frozen, shown a privileged prompt only the teacher reads: the user message
followed by " (The answer is <target>.)". TRL's ``GKDTrainer`` and ``DistillationTrainer``
score the student's tokens under the student's own prompt, so they cannot show a teacher the
answer; its ``trl.experimental.sdft.SDFTTrainer`` can (``teacher_model_kind="base"``,
``teacher_prompt_template``), and it is the peer here.

Both systems run pure distillation (no reward) with the same objective: the sampled-token
reverse KL, each token's advantage ``-(log p_student - log p_teacher)`` of the token the
student sampled, no discount (Forge: ``teacher.coef: 1``, ``discount: 0``, ``rewards: []``;
TRL: ``distillation_mode="sampled_token"``, ``distillation_alpha=1.0``). Shapes are the main
job's: 8 prompts x 8 completions, at most 16 new tokens, temperature 1.0, AdamW lr 1e-5,
grad-norm clip 1.0, one optimizer step per generation batch, the same prompt stream
(``Subtraction(seed=seed)``). Forge runs ``apps/arith/subtract_distill.yaml`` with its precision
``auto`` (bf16 generator and bf16-autocast trainer on a CPU with native bf16); TRL runs in this
process with 2 torch threads, ``use_cpu``, ``bf16`` where the CPU computes it natively.

Afterwards one evaluator scores the base model and each final model: ``forge eval``'s
machinery, greedy, on the task's 200 held-out pairs, ``correct`` (the final number is the
difference) and ``contains`` (the difference appears anywhere). The step time is the median
of the steps after ``--warmup`` (between the ends of consecutive steps; start-up and model
load excluded). The last line is machine-readable:
``trl_distill_step_ratio=<TRL s/step over Forge's> heldout_forge=<x> heldout_trl=<y>``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.e2e import step_clock, trl_clock
from benchmarks.real_e2e import release_memory
from controller import loops

APP_DIR = Path(__file__).resolve().parents[1] / "apps" / "arith"
DISTILL_YAML = APP_DIR / "subtract_distill.yaml"
GRPO_YAML = APP_DIR / "subtract_grpo.yaml"  # evaluation: the same held-out sets, scored by rewards
SYSTEMS = ("forge", "trl")
PROMPTS, GROUP, MAX_TOKENS, LR = 8, 8, 16, 1e-5
PRIVILEGED = (
    "{prompt} (The answer is {target}.)"  # apps/arith/subtract_distill.yaml's teacher.prompt
)


async def run_forge(model: str, steps: int, seed: int, run_dir: Path) -> dict:
    """``apps/arith/subtract_distill.yaml`` without its reward (pure self-distillation, as TRL's),
    evaluation off; returns the step marks and the final model's directory."""
    from controller import shutdown
    from forge.launch import app_module, load_app

    overrides = [
        f"base_model={model}",
        f"rl.policy.model={model}",  # the stage runs alone: no pipeline resolves from-run
        f"seed={seed}",
        f"rl.steps={steps}",
        "rl.rewards=[]",
        "rl.rollout.filter=keep_all",  # every step trains on one generation batch, as TRL
        "rl.eval.at_start=false",
        "rl.eval.at_end=false",
        "rl.eval.every=0",
        "rl.metrics=[]",
    ]
    cfg = load_app(DISTILL_YAML, overrides)[1].rl
    if cfg.teacher.prompt != PRIVILEGED:
        raise ValueError(
            f"{DISTILL_YAML} teacher.prompt is {cfg.teacher.prompt!r}; this benchmark shows TRL's "
            f"teacher {PRIVILEGED!r}: make the two agree"
        )
    app = app_module(cfg.app, str(DISTILL_YAML), needs=("stage", "MetricLog"))
    run_dir.mkdir(parents=True)
    marks: list[float] = []
    with step_clock(app, marks):
        try:
            result = await app.stage(cfg, run_dir, resume=False)
        finally:
            await shutdown()
    return {"marks": marks, "model": result["model"]}


def run_trl(model: str, steps: int, seed: int, out_dir: Path) -> dict:
    """TRL's ``SDFTTrainer`` on the same stream; saves the final model in ``out_dir/final``."""
    try:
        from datasets import Dataset
        from transformers import PrinterCallback
        from trl.experimental.sdft import SDFTConfig, SDFTTrainer
    except ImportError as e:
        raise ImportError("the TRL comparison needs: pip install 'trl==1.16.*'") from e
    import torch

    from apps.arith.task import Subtraction
    from forge.models.precision import native_bf16

    source = Subtraction(seed=seed)
    rows = []
    for _ in range(PROMPTS * (steps + 1)):
        item = source.sample()
        rows.append({"prompt": item["prompt"], "privileged_context": item["target"]})
    marks: list[float] = []
    Clock = trl_clock(marks, [])
    torch.set_num_threads(2)
    args = SDFTConfig(
        output_dir=str(out_dir),
        use_cpu=True,
        bf16=native_bf16("cpu"),
        gradient_checkpointing=False,
        per_device_train_batch_size=PROMPTS * GROUP,  # completions, not prompts
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=MAX_TOKENS,
        temperature=1.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        num_iterations=1,
        max_steps=steps,
        shuffle_dataset=False,  # the stream's order, as Forge's DatasetActor reads it
        teacher_model_kind="base",
        teacher_prompt_template=PRIVILEGED.replace("{target}", "{privileged_context}"),
        distillation_mode="sampled_token",
        distillation_alpha=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=seed,
        model_init_kwargs={"attn_implementation": "eager", "dtype": "float32"},
    )
    trainer = SDFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), callbacks=[Clock()]
    )
    trainer.remove_callback(PrinterCallback)
    marks.append(time.perf_counter())
    trainer.train()
    final = out_dir / "final"
    trainer.save_model(str(final))
    trainer.processing_class.save_pretrained(str(final))
    del trainer
    release_memory()
    return {"marks": marks[1:], "model": str(final)}


async def evaluate(model: str) -> dict[str, float]:
    """``{"correct", "contains"}``: greedy held-out accuracy of ``model`` on the task."""
    from controller import shutdown
    from forge.cli.eval import choose_sets, rl_section, run_eval
    from forge.launch import load_app

    overrides = [f"base_model={model}", f"rl.policy.model={model}", "rl.metrics=[]"]
    rl = rl_section(load_app(GRPO_YAML, overrides)[1])
    try:
        res = await run_eval(rl, choose_sets(rl, None))
    finally:
        await shutdown()
    scores = {("correct" if n == "heldout" else n): m["reward"] for n, m in res.items()}
    return {k: scores[k] for k in ("correct", "contains")}


def median_step(marks: list[float], warmup: int) -> float:
    """The median time between the ends of consecutive steps after ``warmup`` steps."""
    gaps = [b - a for a, b in zip(marks[warmup:], marks[warmup + 1 :])]
    if not gaps:
        raise RuntimeError(f"{len(marks)} step marks leave no timed step after {warmup} warm-up")
    return statistics.median(gaps)


async def main(args: argparse.Namespace) -> None:
    from forge.models.gguf import resolve_model

    base = str(resolve_model("smollm2-135m-instruct"))
    start = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[trl_distill] {msg} (at {time.perf_counter() - start:.0f}s)", flush=True)

    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="forge-trl-distill-") as tmp:
        for system in args.only:
            out = Path(tmp) / system
            t0 = time.perf_counter()
            if system == "forge":
                raw = await run_forge(base, args.steps, args.seed, out)
            else:
                raw = run_trl(base, args.steps, args.seed, out)
            step = median_step(raw["marks"], args.warmup)
            say(
                f"{system}: {args.steps} steps in {time.perf_counter() - t0:.0f}s, median {step:.2f}s"
            )
            rows[system] = {"step": step, "after": await evaluate(raw["model"])}
            say(f"{system}: held out {fmt(rows[system]['after'])}")
        before = await evaluate(base)
    say(f"base model: {fmt(before)}")
    print(f"\n| system | median s/step | correct {before['correct']:.3f} -> | contains |")
    print("| --- | --- | --- | --- |")
    for system, r in rows.items():
        a = r["after"]
        print(f"| {system} | {r['step']:.2f} | {a['correct']:.3f} | {a['contains']:.3f} |")
    ratio = rows["trl"]["step"] / rows["forge"]["step"] if len(rows) == len(SYSTEMS) else math.nan
    held = " ".join(f"heldout_{s}={r['after']['correct']:.3f}" for s, r in rows.items())
    print(f"trl_distill_step_ratio={ratio:.2f} {held}")


def fmt(scores: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in scores.items())


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    p.add_argument("--seed", type=int, default=0, help="the prompt stream's and both seeds")
    p.add_argument("--only", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    args = p.parse_args()
    if args.steps <= args.warmup + 1:
        p.error(f"--steps ({args.steps}) must exceed --warmup + 1 ({args.warmup + 1})")
    return args


if __name__ == "__main__":
    from controller.malloc import reexec_tuned

    # TRL runs in this process: it gets the malloc settings Forge's actors get, as in
    # benchmarks.real_e2e; FORGE_MALLOC=0: glibc's defaults for both.
    reexec_tuned()
    loops.run(main(parse_args()))
