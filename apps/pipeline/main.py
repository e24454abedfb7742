"""SFT, then RL, on any task: the generic pipeline app.

Run:
    forge run --config my_task.yaml

    base model ──▶ sft: (apps.sft.main) ──model──▶ rl: (apps.grpo.main) ──▶ held-out scores
                                                     eval before ──┘└── eval after

The config names a base model (``base_model: <HF dir>``, or ``preset``/``seed`` for a tiny
model built locally), an ``sft:`` section (apps/sft's config; ``app: apps.sft.main`` unless it
names another) and an ``rl:`` section (apps/grpo's config; ``app: apps.grpo.main`` likewise); ``policy.model: from-run`` in a section means "the previous stage's
result". With an environment (``rl.env``) the last line reads ``success_rate=<after>
baseline=<after SFT> mean_turns=<x> minutes=<z>``; without, ``heldout_accuracy=<after>
baseline=<after SFT> minutes=<z>``. docs/environments.md shows a whole config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge import PipelineConfig, RLConfig, sft_then_rl, summary

__all__ = ["STAGE_APPS", "Config", "run"]

STAGE_APPS = {"sft": "apps.sft.main", "rl": "apps.grpo.main"}
"""The app each stage section runs unless it names another (``app:``)."""


@dataclass
class Config(PipelineConfig):
    """A pipeline whose ``sft:`` section runs ``apps.sft.main`` and ``rl:`` runs
    ``apps.grpo.main`` unless they name another app (the other shipped pipeline apps use
    ``forge.PipelineConfig``, whose sections name their apps in the YAML)."""

    stage_apps = STAGE_APPS


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await sft_then_rl(cfg, run_dir, resume, "pipeline")
    print(f"[pipeline] final policy: {result['model']}")
    multi_turn = isinstance(cfg.rl, RLConfig) and cfg.rl.env is not None
    print(summary(result, env=multi_turn), flush=True)
