"""SFT, then RL, in one run directory: a pipeline of apps run as stages.

    make_tiny_model ──▶ sft stage ──model dir──▶ rl stage ──▶ held-out scores
                                                   eval before ──┘└── eval after

A stage is a config section naming its app (``app: apps.sft.main``; a pipeline app's config
may give sections a default app, ``PipelineConfig.stage_apps``: the generic
``apps/pipeline`` gives ``apps.sft.main`` to ``sft:`` and ``apps.grpo.main`` to ``rl:``); the app's
``Config`` is the section's schema and its ``stage(cfg, run_dir, resume) -> dict`` runs it. Each
stage's policy starts from the previous stage's result (``forge.run.policy.retarget``), so
``policy.model: from-run`` in a stage means "what the pipeline hands over". Nothing is
downloaded: a demo's base model is built locally (``preset``, ``seed``) and cached.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from forge.observability.backends import read_jsonl
from forge.observability.names import M
from forge.observability.plot import plot_curves
from forge.run.policy import retarget
from forge.settings import get_cache_dir

__all__ = ["PipelineConfig", "Stage", "build_fingerprint", "run_stage", "sft_then_rl", "summary"]


@dataclass
class Stage:
    """A config section that is a whole app's config: its ``app`` key names the app module,
    whose ``Config`` is the section's schema."""

    app: str
    """The stage's app module (e.g. ``apps.sft.main``; a section may take its default from
    the pipeline config's ``stage_apps``); its ``Config`` is this section's schema."""

    @classmethod
    def __config_schema__(cls, data: dict[str, Any]) -> type:
        from forge.launch import app_module

        return app_module(data.get("app"), "stage", needs=("Config", "stage")).Config


@dataclass
class PipelineConfig:
    """SFT then RL: ``sft`` and ``rl`` are stages (any apps with a ``stage`` entry); each
    stage's policy starts from the previous stage's result."""

    stage_apps: ClassVar[Mapping[str, str]] = {}
    """Each stage section's default ``app`` (``{"rl": "apps.grpo.main", ...}``): none here,
    so forge names no app and each section names its own; ``apps/pipeline``'s ``Config``
    sets defaults."""

    app: str
    """The pipeline's app module (e.g. ``apps.sumdigits.main``)."""
    rl: Stage
    """The RL stage (e.g. ``app: apps.grpo.main``)."""
    sft: Stage | None = None
    """The SFT stage, run first (``None``: the RL stage starts from the base model)."""
    preset: str = "mini"
    """The size of the untrained model built when ``base_model`` is empty
    (``forge make-tiny-model --preset``)."""
    seed: int = 0
    """The run's seed: it builds the base model and is every stage's (and so every role's)
    seed (``forge.run.rl_config.seed_defaults``)."""
    base_model: str = ""
    """The model the first stage starts from: a model directory, a hub id, a GGUF file or a
    shipped model's name (``forge.models.gguf``, e.g. ``smollm2-135m-instruct``); empty: a
    ``preset`` model built with ``seed`` into
    ``<FORGE_CACHE_DIR>/<name>-<preset>-seed<seed>-<build_fingerprint>``."""
    deterministic: bool = False
    """Every stage deterministic (``forge.run.rl_config.DETERMINISTIC``)."""

    @classmethod
    def __config_prepare__(cls, data: dict[str, Any]) -> dict[str, Any]:
        base = data.get("base_model")
        if isinstance(base, str) and base:  # a GGUF file or shipped model: converted now
            from forge.models.gguf import resolve_model

            data = {**data, "base_model": resolve_model(base)}
        data = with_stage_defaults(data, cls.stage_apps)
        for f in dataclasses.fields(cls):
            section = data.get(f.name)
            if "Stage" in str(f.type) and isinstance(section, dict) and "app" not in section:
                raise ValueError(
                    f"{f.name}: missing key 'app' naming the stage's app module (e.g. "
                    f"'app: apps.grpo.main'); a config of the generic pipeline app "
                    f"(app: apps.pipeline.main) gets 'sft: apps.sft.main' and "
                    f"'rl: apps.grpo.main' by default"
                )
        return data

    @classmethod
    def __config_derived__(cls) -> dict[str, str]:
        """Each stage's ``seed`` and ``deterministic`` follow the pipeline's
        (``with_stage_defaults``; ``forge config show`` marks them)."""
        stages = [f.name for f in dataclasses.fields(cls) if "Stage" in str(f.type)]
        return {f"{stage}.{key}": key for stage in stages for key in ("seed", "deterministic")}


def with_stage_defaults(
    data: dict[str, Any], stage_apps: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A pipeline's plain data with each stage's default ``app`` (``stage_apps``, by
    section) filled in, its ``seed``
    handed to every stage (a section with an ``app`` key; ``seed_defaults``) and its
    ``deterministic`` flag to every stage that does not set its own."""
    from forge.run.rl_config import seed_defaults

    if "grpo" in data and "rl" not in data:
        raise ValueError(
            "the pipeline's RL stage is now the section 'rl:' (it was 'grpo:'); rename the "
            "section, and 'grpo.<key>=...' overrides to 'rl.<key>=...'"
        )
    defaults = stage_apps or {}
    data = {
        k: {"app": defaults[k], **v} if k in defaults and isinstance(v, dict) else v
        for k, v in data.items()
    }
    stages = tuple(k for k, v in data.items() if isinstance(v, dict) and "app" in v)
    data = seed_defaults(data, stages)
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


def base_model(cfg: PipelineConfig, name: str, corpus: list[str] | None = None) -> Path | str:
    """The model the first stage starts from: ``cfg.base_model`` (resolved when the config
    loaded), else an untrained model built once into the cache, in a folder named by the
    preset, the seed and ``build_fingerprint(corpus)``: a model is reused only where this
    code on this machine would build the same bytes, so a run whose cache holds an older build
    starts where a run on a fresh cache (a test's, another host's controller) does."""
    from forge.models import make_tiny_model
    from forge.models.loading import _looks_like_path

    given = cfg.base_model
    if given and not Path(given).expanduser().is_dir() and not _looks_like_path(given):
        return cfg.base_model  # a hub id (a path that does not exist yet gets a tiny model)
    built = f"{name}-{cfg.preset}-seed{cfg.seed}-{build_fingerprint(corpus)}"
    base = Path(cfg.base_model or get_cache_dir() / built)
    if not (base / "config.json").exists():
        print(f"[{name}] building a {cfg.preset} model in {base}", flush=True)
        make_tiny_model(base, preset=cfg.preset, seed=cfg.seed, corpus=corpus)
    return base


def build_fingerprint(corpus: list[str] | None = None) -> str:
    """Eight hex digits of what decides a built tiny model's bytes besides its preset and
    seed: the builder's source (``forge.models.tiny``), the torch, transformers and
    tokenizers versions, torch's CPU kernels (a ``normal_`` draw differs in the last bit for
    about a third of the weights between ATen's DEFAULT and AVX2 kernels) and the tokenizer's
    ``corpus``."""
    import hashlib
    import inspect

    import tokenizers
    import torch
    import transformers

    from forge.models import tiny

    parts = [
        inspect.getsource(tiny),
        torch.__version__,
        transformers.__version__,
        tokenizers.__version__,
        torch.backends.cpu.get_cpu_capability(),
        "\n".join(corpus or []),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


async def sft_then_rl(cfg: PipelineConfig, run_dir: Path, resume: bool, name: str) -> dict:
    """Build (or reuse) the base model, run the SFT stage (if any), then the RL stage from
    its result. Returns ``{"evals": {step: score}, "first", "last", "mean_turns", "sets",
    "minutes", "history", "model"}`` (``first``: the evaluation before the first step,
    ``last``: the last one after a step, each ``nan`` if none ran; ``mean_turns``: the last evaluation's, with an environment;
    ``sets``: ``{name: (first, last)}`` of each ``eval.sets`` entry's pass@1; ``model``: the
    final policy's directory); writes ``curves.png`` into ``run_dir``."""
    t0 = time.perf_counter()
    start = str(base_model(cfg, name))
    if cfg.sft is not None:
        retarget(cfg.sft, start)
        start = str((await run_stage(cfg.sft, run_dir / "sft", resume))["model"])
    retarget(cfg.rl, start)
    result = await run_stage(cfg.rl, run_dir / "rl", resume)
    rows = _rows(run_dir / "rl" / "metrics.jsonl")
    evals = {**_column(rows, M.HELDOUT_ACCURACY), **result["eval"]}
    turns = _column(rows, M.MEAN_TURNS)
    sets = [f"eval/{x.name}/pass@1" for x in getattr(getattr(cfg.rl, "eval", None), "sets", [])]
    set_scores = {}
    for key in sets:
        col = _column(rows, key)
        if col:
            set_scores[key.split("/")[1]] = (_before(col), _after(col))
    keys = [M.REWARD, M.LOSS, M.HELDOUT_ACCURACY, *sets]
    plot_curves(result["history"], keys, run_dir / "curves.png")
    print(f"[{name}] curves: {run_dir / 'curves.png'}")
    nan = float("nan")
    return {
        "evals": evals,
        "first": _before(evals),
        "last": _after(evals),
        "mean_turns": turns[max(turns)] if turns else nan,
        "sets": set_scores,
        "minutes": (time.perf_counter() - t0) / 60,
        "history": result["history"],
        "model": result.get("model"),
    }


def summary(result: dict, env: bool) -> str:
    """A pipeline's last line: ``success_rate= baseline= mean_turns= minutes=`` with an
    environment, ``heldout_accuracy= baseline= minutes=`` without (``baseline``: the first
    evaluation, normally the SFT model's)."""
    r = result
    if env:
        head = f"success_rate={r['last']:.3f} baseline={r['first']:.3f} "
        return head + f"mean_turns={r['mean_turns']:.2f} minutes={r['minutes']:.2f}"
    return f"heldout_accuracy={r['last']:.3f} baseline={r['first']:.3f} minutes={r['minutes']:.2f}"


def _before(col: dict[int, float]) -> float:
    """The evaluation at step 0 (before training: ``eval.at_start``), else ``nan``."""
    return col.get(0, float("nan"))


def _after(col: dict[int, float]) -> float:
    """The last evaluation after a training step, else ``nan``."""
    return col[max(col)] if col and max(col) > 0 else float("nan")


def _rows(path: Path) -> list[dict]:
    """The RL stage's metric rows (those logged before a resume among them)."""
    return read_jsonl(path)


def _column(rows: list[dict], name: str) -> dict[int, float]:
    return {r["step"]: r[name] for r in rows if name in r}
