"""The tinker-cookbook's on-policy distillation, unchanged, against ``forge serve``.

    python scripts/cookbook_distill.py --work /tmp/distill [--model smollm2|toy] [--steps 3]
    python scripts/cookbook_distill.py --work /tmp/sdft --algorithm sdft [--topk 20] ...

``tinker_cookbook.distillation.train_on_policy`` (tinker-cookbook 0.5.8, run from its own venv,
``scripts/cookbook_venv.sh``) trains a student LoRA to match a teacher: it samples the
student, scores the samples with the teacher's ``compute_logprobs`` and trains with
``importance_sampling`` on the negative reverse KL (``teacher_kl`` in its metrics). Here:

1. ``forge serve`` starts (``<work>/serve.yaml``) and a teacher is trained through the SDK: a
   LoRA adapter on the same base, supervised on "What is a + b? Answer with just the
   number." -> "a + b" for ``--teacher-steps`` steps, saved with
   ``save_weights_for_sampler("teacher")``; the server is stopped.
2. ``forge serve`` starts again on the same directory, so the teacher's trainer is gone and
   the recipe's teacher client samples the checkpoint from disk. The recipe's
   ``train_on_policy.main`` runs with the student a fresh LoRA on the base model, the teacher
   ``TeacherConfig(base_model, load_checkpoint_path=tinker://.../sampler_weights/teacher)``
   and a prompt-only dataset of other sums (the cookbook's own ``PromptOnlyDataset``): the
   recipe's command line (``recipes/distillation/on_policy_distillation``) offers only
   DeepMath and Tulu3 from the Hugging Face hub, which this machine cannot reach, so this
   script builds the same ``train_on_policy.Config`` that command line builds, with that
   dataset, and calls ``main`` as it does.
3. The recipe's per-step metrics (its ``metrics.jsonl``) are printed as a table.

``--algorithm sdft`` runs ``tinker_cookbook.distillation.sdft.main`` (self-distillation: the
base model, shown the answer in its prompt, is the teacher; its top-``--topk`` prompt
logprobs are the soft targets of an ``[N, K]`` ``cross_entropy``) on the same sums, with the
answer as the golden demonstration, instead of steps 1 and 2.

``--model smollm2`` serves SmolLM2-135M-Instruct under its converted directory's path (the
recipe loads its tokenizer with ``AutoTokenizer.from_pretrained(model_name)``); ``toy`` the
tiny random-weight model (for the test: it proves the calls, not the learning). The same file
is the recipe's side when run with ``--recipe`` by the cookbook venv's python.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KEY_ENV = "FORGE_API_KEY"
RENDERER = "qwen3_instruct"  # ChatML without thinking tokens: SmolLM2's chat format
QUESTION = "What is {a} + {b}? Answer with just the number."


def sums(seed: int, n: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 50), rng.randint(1, 50)) for _ in range(n)]


# -- the recipe's side (the cookbook venv) ------------------------------------------------


def run_recipe(args: argparse.Namespace) -> None:
    """``train_on_policy.main`` with the config ``on_policy_distillation``'s CLI would build,
    over a local prompt-only dataset."""
    import asyncio

    import chz
    from tinker_cookbook import renderers
    from tinker_cookbook.distillation import train_on_policy
    from tinker_cookbook.distillation.datasets import (
        DistillationDatasetConfig,
        PromptOnlyDataset,
        TeacherConfig,
    )
    from tinker_cookbook.rl.types import RLDatasetBuilder
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    @chz.chz
    class LocalSums(RLDatasetBuilder):
        groups_per_batch: int
        group_size: int
        model_name: str
        count: int

        async def __call__(self):
            tokenizer = get_tokenizer(self.model_name)
            renderer = renderers.get_renderer(RENDERER, tokenizer=tokenizer)
            prompts = [QUESTION.format(a=a, b=b) for a, b in sums(1, self.count)]
            dataset = PromptOnlyDataset(
                prompts, self.groups_per_batch, self.group_size, renderer, tokenizer
            )
            return dataset, None

    config = train_on_policy.Config(
        recipe_name="recipe_distillation_on_policy",
        learning_rate=args.lr,
        dataset_configs=[
            DistillationDatasetConfig(
                dataset_builder=LocalSums(
                    groups_per_batch=args.groups,
                    group_size=args.group_size,
                    model_name=args.model_name,
                    count=args.groups * args.steps,
                ),
                teacher_config=TeacherConfig(
                    base_model=args.model_name, load_checkpoint_path=args.teacher
                ),
                groups_per_batch=args.groups,
            )
        ],
        model_name=args.model_name,
        renderer_name=RENDERER,
        lora_rank=args.rank,
        max_tokens=args.max_tokens,
        log_path=args.log_path,
        base_url=args.base_url,
        max_steps=args.steps,
    )
    asyncio.run(train_on_policy.main(config))


def run_sdft(args: argparse.Namespace) -> None:
    """``sdft.main`` over the sums, each with its answer as the golden demonstration."""
    import asyncio
    from functools import partial

    from tinker_cookbook import renderers
    from tinker_cookbook.distillation import sdft
    from tinker_cookbook.distillation.datasets import PromptOnlyEnv
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderer = renderers.get_renderer(RENDERER, tokenizer=get_tokenizer(args.model_name))
    pairs = sums(1, args.groups * args.steps)

    class Sums:  # sdft.SDFTBatchProvider
        def __len__(self) -> int:
            return args.steps

        def get_batch(self, index: int):
            batch = pairs[index * args.groups : (index + 1) * args.groups]
            questions = [QUESTION.format(a=a, b=b) for a, b in batch]
            builders = [
                ProblemGroupBuilder(partial(PromptOnlyEnv, q, renderer), args.group_size, "sums")
                for q in questions
            ]
            return builders, questions, [str(a + b) for a, b in batch]

    config = sdft.Config(
        model_name=args.model_name,
        recipe_name="sdft",
        renderer_name=RENDERER,
        lora_rank=args.rank,
        base_url=args.base_url,
        learning_rate=args.lr,
        max_tokens=args.max_tokens,
        topk=args.topk,
        max_context_length=2048,
        log_path=args.log_path,
        max_steps=args.steps,
    )
    asyncio.run(sdft.main(config, Sums()))


# -- the driver's side (the main environment) ---------------------------------------------


class Server:
    """``forge serve --config <work>/serve.yaml`` on a free port, stopped as Ctrl-C does."""

    def __init__(self, work: Path, config: str, key: str) -> None:
        (work / "serve.yaml").write_text(config)
        self.log = open(work / "server.log", "a")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forge.cli", "serve", "--config", str(work / "serve.yaml")]
            + ["--port", "0"],
            cwd=str(REPO),
            env={**os.environ, KEY_ENV: key},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        deadline, self.url = time.monotonic() + 300, None
        while self.url is None and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.write(line)
            if m := re.search(r"Tinker API on (http://\S+)", line):
                self.url = m.group(1)
        if self.url is None:
            self.stop()
            raise RuntimeError(f"forge serve did not start; see {work / 'server.log'}")
        self.drain = subprocess.Popen(["cat"], stdin=self.proc.stdout, stdout=self.log)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if getattr(self, "drain", None) is not None:
            self.drain.wait(10)
        self.log.close()


def train_teacher(url: str, key: str, model: str, steps: int, rank: int, lr: float) -> str:
    """A LoRA adapter supervised on short answers to sums; its ``sampler_weights`` path."""
    import tinker
    from tinker import types

    from forge.models import load_tokenizer

    service = tinker.ServiceClient(base_url=url, api_key=key)
    tc = service.create_lora_training_client(base_model=model, rank=rank).result()
    tok = load_tokenizer(model)

    def datum(a: int, b: int) -> types.Datum:
        prompt = tok.encode(
            f"<|im_start|>user\n{QUESTION.format(a=a, b=b)}<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )
        answer = tok.encode(f"{a + b}<|im_end|>", add_special_tokens=False)
        tokens = prompt + answer
        weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
        return types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
        )

    data = [datum(a, b) for a, b in sums(0, 16 * steps)]
    for step in range(steps):
        batch = data[16 * step : 16 * (step + 1)]
        fb = tc.forward_backward(batch, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()
        tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in batch)
        print(f"[teacher] step {step}: loss/token {fb.result().metrics['loss:sum'] / tokens:.3f}")
    path = tc.save_weights_for_sampler("teacher").result().path
    service.close("success").result(timeout=60)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="a directory for the server and the run")
    p.add_argument("--model", choices=("smollm2", "toy"), default="smollm2")
    p.add_argument("--steps", type=int, default=3, help="the recipe's max_steps")
    p.add_argument("--groups", type=int, default=4, help="the recipe's groups_per_batch")
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3, help="the student's learning rate")
    p.add_argument("--teacher-steps", type=int, default=8)
    p.add_argument("--teacher-lr", type=float, default=2e-3)
    p.add_argument("--algorithm", choices=("train_on_policy", "sdft"), default="train_on_policy")
    p.add_argument("--topk", type=int, default=20, help="sdft: the teacher's top-k")
    p.add_argument("--cookbook-python", default=os.environ.get("TINKER_COOKBOOK_PYTHON", ""))
    p.add_argument("--recipe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--model-name", help=argparse.SUPPRESS)
    p.add_argument("--teacher", help=argparse.SUPPRESS)
    p.add_argument("--log-path", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.recipe and args.algorithm == "sdft":
        run_sdft(args)
        return 0
    if args.recipe:
        run_recipe(args)
        return 0
    return drive(args)


def drive(args: argparse.Namespace) -> int:
    import secrets

    sys.path.insert(0, str(REPO))  # forge, when run as a script from anywhere

    python = (
        args.cookbook_python
        or subprocess.run(
            ["bash", str(REPO / "scripts/cookbook_venv.sh")],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.model == "smollm2":
        from forge.models.gguf import resolve_model

        model, path = resolve_model("smollm2-135m-instruct"), "smollm2-135m-instruct"
    else:
        from forge.models.tiny import ensure_tiny_model

        model = path = str(ensure_tiny_model("tiny"))
    key = "tml-" + secrets.token_urlsafe(24)
    config = (
        f"models:\n  - {{name: {model}, path: {path}}}\n"
        f"dir: {work / 'ckpt'}\ndtype: auto\nautocast: auto\n"
    )
    teacher = ""
    if args.algorithm == "train_on_policy":
        t0 = time.monotonic()
        server = Server(work, config, key)
        try:
            teacher = train_teacher(
                server.url, key, model, args.teacher_steps, args.rank, args.teacher_lr
            )
        finally:
            server.stop()
        print(f"[teacher] {teacher} ({time.monotonic() - t0:.0f} s); restarting the server")
    server = Server(work, config, key)
    log_path = work / "run"
    try:
        t1 = time.monotonic()
        recipe = [python, str(Path(__file__).resolve()), "--recipe", "--work", str(work)]
        recipe += [f"--base-url={server.url}", f"--model-name={model}", f"--teacher={teacher}"]
        recipe += [f"--log-path={log_path}", f"--steps={args.steps}", f"--groups={args.groups}"]
        recipe += [f"--group-size={args.group_size}", f"--max-tokens={args.max_tokens}"]
        recipe += [f"--rank={args.rank}", f"--lr={args.lr}", f"--algorithm={args.algorithm}"]
        recipe += [f"--topk={args.topk}"]
        done = subprocess.run(recipe, cwd=str(work), env={**os.environ, "TINKER_API_KEY": key})
    finally:
        server.stop()
    print(f"[recipe] exit {done.returncode} ({time.monotonic() - t1:.0f} s)")
    if done.returncode != 0:
        return done.returncode
    print_metrics(log_path / "metrics.jsonl", METRICS[args.algorithm])
    return 0


METRICS = {
    "train_on_policy": (
        "teacher_kl",
        "env/all/ac_tokens_per_turn",
        "optim/kl_sample_train_v1",
        "time/total",
    ),
    "sdft": (
        "sdft/mean_teacher_entropy",
        "grad_norm:mean",
        "env/all/ac_tokens_per_turn",
        "time/total",
    ),
}


def print_metrics(path: Path, keys: tuple[str, ...]) -> None:
    print("| step | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for line in path.open():
        row = json.loads(line)
        cells = [f"{row[k]:.4g}" if isinstance(row.get(k), float) else "-" for k in keys]
        print(f"| {row['step']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
