"""The toy CPU demo: sum the digits of N with a 0.33M-parameter model built here, SFT, then GRPO.

The fast test configuration (the README's main job is the real model, ``apps/arith``). Run
(about 4 minutes on 2 cores: 3.75 on a quiet machine, docs/benchmarks.md):
    forge run --config apps/sumdigits/cpu.yaml          # GRPO
    forge run --config apps/sumdigits/ppo.yaml          # PPO with a critic, same budget

    make_tiny_model ──▶ SFT (apps/sft) ──model dir──▶ GRPO (apps/grpo) ──▶ held-out accuracy
                                                        eval before ──┘└── eval after

The two stages are apps named in the YAML (``sft.app``, ``rl.app``), run in order by
``forge.run.pipeline.sft_then_rl``.

Nothing is downloaded: the tokenizer and model are built locally, the data is generated
(``apps.sumdigits.task``: a data source and a reward function, named in the YAML by import
string). The SFT stage is deliberately short: it teaches the answer format and part of the
skill, and GRPO (exact-match reward) does the rest. The run writes curves.png and
metrics.jsonl into the run directory and ends with
``heldout_accuracy=<x> sft_accuracy=<y> minutes=<z>``.
"""

from __future__ import annotations

from pathlib import Path

from forge import PipelineConfig as Config
from forge import sft_then_rl

__all__ = ["Config", "run"]


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await sft_then_rl(cfg, run_dir, resume, "sumdigits")
    print(
        f"heldout_accuracy={result['last']:.3f} sft_accuracy={result['first']:.3f} "
        f"minutes={result['minutes']:.2f}",
        flush=True,
    )
