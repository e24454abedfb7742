"""SFT, then RL, in one run directory: a pipeline of apps run as stages.

    make_tiny_model ──▶ sft stage ──model dir──▶ rl stage ──▶ held-out scores
                                                   eval before ──┘└── eval after

A stage is a config section naming its app (``app: apps.sft.main``); the app's ``Config``
is the section's schema and its ``stage(cfg, run_dir, resume) -> dict`` runs it. Each
stage's policy starts from the previous stage's result (``forge.run.policy.retarget``), so
``policy.model: from-run`` in a stage means "what the pipeline hands over". Nothing is
downloaded: a demo's base model is built locally (``preset``, ``seed``) and cached.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.env import get_cache_dir
from forge.observability.names import M
from forge.observability.plot import plot_curves
from forge.run.policy import retarget

__all__ = ["PipelineConfig", "Stage", "run_stage", "sft_then_rl"]


@dataclass
class Stage:
    """A config section that is a whole app's config: its ``app`` key names the app module,
    whose ``Config`` is the section's schema."""

    app: str

    @classmethod
    def __config_schema__(cls, data: dict[str, Any]) -> type:
        from forge.launch import app_module

        return app_module(data.get("app"), "stage", needs=("Config", "stage")).Config


@dataclass
class PipelineConfig:
    """SFT then RL: ``sft`` and ``grpo`` are stages (any apps with a ``stage`` entry);
    ``base_model``: the model SFT starts from (default: a ``preset`` model built with
    ``seed`` into ``<FORGE_CACHE_DIR>/<name>-<preset>-seed<seed>``)."""

    app: str
    sft: Stage
    grpo: Stage
    preset: str = "mini"
    seed: int = 0
    base_model: str = ""
    deterministic: bool = False  # every stage deterministic (forge.run.config)

    @classmethod
    def __config_prepare__(cls, data: dict[str, Any]) -> dict[str, Any]:
        return with_stage_defaults(data)


def with_stage_defaults(data: dict[str, Any]) -> dict[str, Any]:
    """A pipeline's plain data with its ``deterministic`` flag handed to every stage (a
    section with an ``app`` key) that does not set its own."""
    if not data.get("deterministic"):
        return data
    return {
        k: {"deterministic": True, **v} if isinstance(v, dict) and "app" in v else v
        for k, v in data.items()
    }


async def run_stage(cfg: Any, run_dir: Path, resume: bool) -> dict:
    """Run the stage ``cfg`` (a config whose ``app`` has a ``stage`` entry) in ``run_dir``."""
    from forge.launch import app_module

    run_dir.mkdir(parents=True, exist_ok=True)
    return await app_module(cfg.app, "stage", needs=("stage",)).stage(cfg, run_dir, resume)


def base_model(cfg: PipelineConfig, name: str, corpus: list[str] | None = None) -> Path:
    """The untrained model a demo starts from, built once into the cache."""
    from forge.models import make_tiny_model

    base = Path(cfg.base_model or get_cache_dir() / f"{name}-{cfg.preset}-seed{cfg.seed}")
    if not (base / "config.json").exists():
        print(f"[{name}] building a {cfg.preset} model in {base}", flush=True)
        make_tiny_model(base, preset=cfg.preset, seed=cfg.seed, corpus=corpus)
    return base


async def sft_then_rl(cfg: PipelineConfig, run_dir: Path, resume: bool, name: str) -> dict:
    """Build (or reuse) the base model, run the SFT stage, then the RL stage from its
    result. Returns ``{"evals": {step: score}, "first", "last", "minutes", "history"}``
    (``first``/``last``: the first and last evaluation, ``nan`` if none ran); writes
    ``curves.png`` into ``run_dir``."""
    t0 = time.perf_counter()
    retarget(cfg.sft, str(base_model(cfg, name)))
    sft = await run_stage(cfg.sft, run_dir / "sft", resume)
    retarget(cfg.grpo, str(sft["model"]))
    result = await run_stage(cfg.grpo, run_dir / "grpo", resume)
    evals = {**_previous_evals(run_dir / "grpo" / "metrics.jsonl"), **result["eval"]}
    plot_curves(result["history"], [M.REWARD, M.LOSS, M.HELDOUT_ACCURACY], run_dir / "curves.png")
    print(f"[{name}] curves: {run_dir / 'curves.png'}")
    nan = float("nan")
    return {
        "evals": evals,
        "first": evals[min(evals)] if evals else nan,
        "last": evals[max(evals)] if evals else nan,
        "minutes": (time.perf_counter() - t0) / 60,
        "history": result["history"],
    }


def _previous_evals(path: Path) -> dict[int, float]:
    """Evaluations logged before a resume (the SFT baseline among them)."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: r[M.HELDOUT_ACCURACY] for r in rows if M.HELDOUT_ACCURACY in r}
