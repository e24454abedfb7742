"""The float32 LM head through MKL (``linear``) or oneDNN (``cpu_head``), A/B in one process.

    python -m benchmarks.cpu_head [--repeats 6]

SmolLM2-135M-Instruct (converted once) in float32 (the main job's precision on a CPU without
native bf16), 2 threads, the malloc settings of actor processes. Two parts, each alternating
the two heads repetition by repetition (so the machine's drift hits both alike):

- generation: Forge's ``HFEngine`` alone, the main job's shape (8 prompts x 8 samples, 16
  sampled tokens, ``ignore_eos``);
- a trainer step: ``TrainerCore.train_step`` on the main job's batch
  (``benchmarks.real_model.sample_batch``), no autocast.

Prints every repetition, then the medians, the ratio, and in how many pairs oneDNN was faster.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _toggle(model, on: bool) -> None:
    from forge.models import cpu_head
    from forge.models.logprobs import output_head

    head = output_head(model)
    head.__dict__.pop("forward", None)
    if on and not cpu_head.use_onednn_head(model):
        raise SystemExit("the oneDNN head does not apply here (see forge/models/cpu_head.py)")


def _ab(name: str, model, work, repeats: int) -> None:
    _toggle(model, True)
    work()  # warm-up, both heads
    _toggle(model, False)
    work()
    times: dict[str, list[float]] = {"mkl": [], "onednn": []}
    for rep in range(repeats):
        for head in ("mkl", "onednn"):
            _toggle(model, head == "onednn")
            t = time.perf_counter()
            work()
            times[head].append(time.perf_counter() - t)
            print(f"[cpu_head] {name} rep {rep + 1} {head}: {times[head][-1]:.2f} s", flush=True)
    a, b = statistics.median(times["mkl"]), statistics.median(times["onednn"])
    wins = sum(o < m for m, o in zip(times["mkl"], times["onednn"]))
    print(
        f"[cpu_head] {name}: MKL {a:.2f} s, oneDNN {b:.2f} s (x{a / b:.2f}); oneDNN faster "
        f"in {wins} of {repeats} pairs",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()

    import torch

    from apps.arith.task import Addition
    from benchmarks.real_model import sample_batch
    from forge.generation.hf_engine import HFEngine
    from forge.models import load_model, load_tokenizer
    from forge.models.gguf import resolve_model
    from forge.training.trainer_config import TrainerConfig
    from forge.training.trainer_core import TrainerCore
    from forge.types import SamplingParams

    torch.set_num_threads(2)
    model_dir = resolve_model("smollm2-135m-instruct")
    model = load_model(model_dir, dtype="float32")
    engine = HFEngine(model, load_tokenizer(model_dir), max_batch_size=64, seed=0)
    src = Addition(seed=5)
    prompts = [src.sample()["prompt"] for _ in range(8)]
    params = SamplingParams(n=8, max_tokens=16, ignore_eos=True, seed=1)
    _ab("generation", model, lambda: engine.generate([(p, params) for p in prompts]), args.repeats)

    batch = sample_batch(model_dir, dtype="float32")[0]
    core = TrainerCore(TrainerConfig(model=model_dir, device="cpu"))
    _ab("trainer step", core.adapter.model, lambda: core.train_step(batch), args.repeats)


if __name__ == "__main__":
    from controller.malloc import reexec_tuned

    reexec_tuned()  # the malloc settings actor processes run with (FORGE_MALLOC=0: not)
    main()
