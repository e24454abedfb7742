"""SFT then RL on a model built here: the shared pipeline of the CPU demos.

    make_tiny_model ──▶ SFT (apps/sft) ──model dir──▶ GRPO (apps/grpo) ──▶ held-out scores
                                                        eval before ──┘└── eval after

Nothing is downloaded: the tokenizer and model are built locally. Each demo's ``run`` calls
``sft_then_rl`` and prints its own summary line.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from apps.grpo.main import Config as GRPOConfig
from apps.grpo.main import train as grpo_train
from apps.grpo.supervise import train_with_restarts
from apps.sft.main import Config as SFTConfig
from apps.sft.main import train as sft_train
from forge.env import get_cache_dir
from forge.models import make_tiny_model
from forge.observability.plot import plot_curves


@dataclass
class Config:
    app: str
    sft: SFTConfig
    grpo: GRPOConfig
    preset: str = "mini"
    seed: int = 0
    base_model: str = ""  # default: <FORGE_CACHE_DIR>/<name>-<preset>-seed<seed>


async def sft_then_rl(cfg: Config, run_dir: Path, resume: bool, name: str) -> dict:
    """Build (or reuse) the base model, SFT it, then run GRPO from the result. Returns
    ``{"evals": {step: score}, "first", "last", "minutes", "history"}``; writes
    ``curves.png`` into ``run_dir``."""
    t0 = time.perf_counter()
    base = Path(cfg.base_model or get_cache_dir() / f"{name}-{cfg.preset}-seed{cfg.seed}")
    if not (base / "config.json").exists():
        print(f"[{name}] building a {cfg.preset} model in {base}", flush=True)
        make_tiny_model(base, preset=cfg.preset, seed=cfg.seed)
    cfg.sft.model = cfg.sft.trainer.model = str(base)
    sft_dir = Path(cfg.sft.output or run_dir / "sft_model")
    cfg.sft.output = str(sft_dir)
    if not (resume and (sft_dir / "config.json").exists()):
        (run_dir / "sft").mkdir(exist_ok=True)
        await sft_train(cfg.sft, run_dir / "sft")
    # Hand the SFT result to GRPO: the policy, the generator and the trainer all start there,
    # and so do a value model and a reference model when the config has them.
    g = cfg.grpo
    g.model = g.generator.model = g.trainer.model = str(sft_dir)
    for part in (g.critic, g.reference):
        if part is not None:
            part.model = str(sft_dir)
    (run_dir / "grpo").mkdir(exist_ok=True)
    result = await train_with_restarts(grpo_train, g, run_dir / "grpo", resume)
    evals = {**_previous_evals(run_dir / "grpo" / "metrics.jsonl"), **result["eval"]}
    plot_curves(
        result["history"],
        ["rollout/reward", "train/loss", "eval/heldout_accuracy"],
        run_dir / "curves.png",
    )
    print(f"[{name}] curves: {run_dir / 'curves.png'}")
    return {
        "evals": evals,
        "first": evals[min(evals)],
        "last": evals[max(evals)],
        "minutes": (time.perf_counter() - t0) / 60,
        "history": result["history"],
    }


def _previous_evals(path: Path) -> dict[int, float]:
    """Evaluations logged before a resume (the SFT baseline among them)."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r["eval/heldout_accuracy"] for r in rows if "eval/heldout_accuracy" in r}
