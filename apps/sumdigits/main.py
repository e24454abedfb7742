"""The CPU demo that learns: sum the digits of N with a model built here, SFT, then GRPO.

Run (the README's main job; about 5 minutes on 2 cores):
    forge run --config apps/sumdigits/cpu.yaml

    make_tiny_model ──▶ SFT (apps/sft) ──model dir──▶ GRPO (apps/grpo) ──▶ held-out accuracy
                                                        eval before ──┘└── eval after

Nothing is downloaded: the tokenizer and model are built locally, the data is generated. The
SFT stage is deliberately short: it teaches the answer format and part of the skill, and GRPO
(exact-match reward) does the rest. The run writes curves.png and metrics.jsonl into the run
directory and ends with ``heldout_accuracy=<x> sft_accuracy=<y> minutes=<z>``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from apps.grpo.main import Config as GRPOConfig
from apps.grpo.main import train as grpo_train
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
    base_model: str = ""  # default: <FORGE_CACHE_DIR>/sumdigits-<preset>-seed<seed>


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    t0 = time.perf_counter()
    base = Path(cfg.base_model or get_cache_dir() / f"sumdigits-{cfg.preset}-seed{cfg.seed}")
    if not (base / "config.json").exists():
        print(f"[sumdigits] building a {cfg.preset} model in {base}", flush=True)
        make_tiny_model(base, preset=cfg.preset, seed=cfg.seed)
    cfg.sft.model = cfg.sft.trainer.model = str(base)
    sft_dir = Path(cfg.sft.output or run_dir / "sft_model")
    cfg.sft.output = str(sft_dir)
    if not (resume and (sft_dir / "config.json").exists()):
        (run_dir / "sft").mkdir(exist_ok=True)
        await sft_train(cfg.sft, run_dir / "sft")
    # Hand the SFT result to GRPO: the policy, the generator and the trainer all start there.
    cfg.grpo.model = cfg.grpo.generator.model = cfg.grpo.trainer.model = str(sft_dir)
    for part in (cfg.grpo.critic, cfg.grpo.reference):  # a value model / reference start there
        if part is not None:
            part.model = str(sft_dir)
    (run_dir / "grpo").mkdir(exist_ok=True)
    result = await grpo_train(cfg.grpo, run_dir / "grpo", resume)
    evals = {**_previous_evals(run_dir / "grpo" / "metrics.jsonl"), **result["eval"]}
    first, last = min(evals), max(evals)
    plot_curves(
        result["history"],
        ["rollout/reward", "train/loss", "eval/heldout_accuracy"],
        run_dir / "curves.png",
    )
    minutes = (time.perf_counter() - t0) / 60
    print(f"[sumdigits] curves: {run_dir / 'curves.png'}")
    print(
        f"heldout_accuracy={evals[last]:.3f} sft_accuracy={evals[first]:.3f} minutes={minutes:.2f}",
        flush=True,
    )


def _previous_evals(path: Path) -> dict[int, float]:
    """Evaluations logged before a resume (the SFT baseline among them)."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r["eval/heldout_accuracy"] for r in rows if "eval/heldout_accuracy" in r}


if __name__ == "__main__":
    from forge.cli import main as forge_main

    sys.exit(forge_main(["run", *sys.argv[1:]]))
