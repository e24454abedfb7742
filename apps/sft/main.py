"""SFT: supervised fine-tuning on (prompt, target) pairs or chat transcripts with the Trainer.

Run:
    forge run --config apps/sft/configs/sumdigits.yaml

    data source ──items──▶ sft_batch (tokenize) ──TrainBatch──▶ Trainer ──export_hf──▶ model dir

The loss is the token-mean negative log-likelihood of the target tokens (REINFORCE with an
advantage of 1 on every target token is exactly that), so SFT reuses the RL trainer, its
optimiser, schedule, micro-batching and data parallelism unchanged. The result is written as
an HF model directory that an RL run can start from (``forge.run.pipeline``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forge import (
    DATA_SOURCE,
    HistoryWindow,
    M,
    MetricLog,
    RunConfig,
    Spec,
    Trainer,
    TrainerConfig,
    actor_env_vars,
    load_tokenizer,
    progress,
    sft_batch,
)


@dataclass(kw_only=True)
class Config(RunConfig):
    """An SFT run: the shared run config (``forge.RunConfig``: policy, trainer, data, steps,
    metrics, seed, ...) plus the batch size, the output directory and a history window;
    ``steps`` batches of ``batch_size`` items from ``data``, one optimizer step each, then
    the result exported as an HF model directory."""

    trainer: TrainerConfig
    """The trainer; ``loss.type`` must be ``reinforce`` (NLL with advantage 1)."""
    data: Spec
    """A data source (``forge.slots.DATA_SOURCE``) of (prompt, target) pairs or chat
    transcripts; see ``forge.data.sft_batch``."""
    steps: int = 200
    """Optimizer steps."""
    batch_size: int = 64
    """Items per step."""
    output: str = ""
    """HF directory for the result (empty: ``<run_dir>/model``)."""
    history: HistoryWindow | None = None
    """The RL run's ``env.history``: transcripts become rows as the RL run will see them."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.trainer.loss.type != "reinforce":
            raise ValueError(
                f"trainer.loss.type={self.trainer.loss.type!r}: SFT needs reinforce (NLL with "
                "advantage 1)"
            )


async def train(cfg: Config, run_dir: Path) -> Path:
    """Fine-tune and export; returns the HF directory of the result."""
    source = DATA_SOURCE.resolve(cfg.data)()
    tokenizer = load_tokenizer(cfg.policy.model)
    trainer = await Trainer.options(
        env_vars=actor_env_vars(cfg.threads_per_actor, cfg.deterministic)
    ).as_actor(cfg.trainer)
    log = MetricLog(run_dir, cfg.metrics)
    bar = progress(range(cfg.steps), "sft")
    for step in bar:
        items = [source.sample() for _ in range(cfg.batch_size)]
        batch = sft_batch(tokenizer, items, cfg.history)
        metrics = (await trainer.train_step.call(batch)).item(procs=0)
        log.step(step + 1, {M.SFT_LOSS: metrics["loss"], M.SFT_LR: metrics["lr"]})
        bar.set_postfix(loss=f"{metrics['loss']:.4f}")
    bar.close()
    out = Path(cfg.output or run_dir / "model")
    await trainer.export_hf.call(str(out))
    await trainer.shutdown()
    log.close()
    return out


async def stage(cfg: Config, run_dir: Path, resume: bool) -> dict:
    """This app as a pipeline stage: on resume, a finished result is kept, not redone."""
    out = Path(cfg.output or run_dir / "model")
    if not (resume and (out / "config.json").exists()):
        out = await train(cfg, run_dir)
    return {"model": out}


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    out = (await stage(cfg, run_dir, resume))["model"]
    print(f"[sft] model written to {out}")
