"""A reasoning-gym task learned on a 2-core CPU: SFT on the dataset's own answers, then GRPO
with the dataset's own ``score_answer`` as the reward, through Forge's adapter
(``forge.integrations.reasoning_gym``).

Run (about 3 minutes on 2 cores):
    forge run --config apps/rgym/cpu.yaml [seed=1 rl.steps=... ...]

    make_tiny_model ──▶ SFT: Answers ──model dir──▶ GRPO: data {fn: reasoning_gym}, ──▶ held-out
                        (question ▶ answer text)           rewards [{fn: reasoning_gym}]   success

The task is reasoning-gym's ``spell_backward`` on 3-5 letter words, small enough for the
~0.33M-parameter byte-level model built here. Its reward gives credit per letter in place,
a dense signal for GRPO. The held-out words come from their own seed and are removed from
both stages' training data, so success measures the skill (reversing unseen words), not
memory. The short SFT teaches the format (the bare answer; with no ``<answer>`` tags the
reward scores the whole response) and part of the skill; GRPO does the rest. Held-out
success counts exact answers only (``eval.reward``: the same reward with ``binary: true``).
The run writes curves.png and metrics.jsonl into the run directory and ends with
``success_rate=<after RL> baseline=<after SFT> minutes=<z>``.
"""

from __future__ import annotations

from pathlib import Path

from forge import PipelineConfig as Config
from forge import sft_then_rl

__all__ = ["Config", "run"]


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await sft_then_rl(cfg, run_dir, resume, "rgym")
    print(
        f"success_rate={result['last']:.3f} baseline={result['first']:.3f} "
        f"minutes={result['minutes']:.2f}",
        flush=True,
    )
