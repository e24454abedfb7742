"""The policy computed twice, checked once before the first step and watched after it.

The generator samples tokens and reports their logprobs; the trainer recomputes them. The two
must agree (up to the precision each runs in): every policy ratio, KL term and TIS weight is
their difference. A model whose generator path is wrong (a cache the engine mishandles, a
post-scaled head, an unverified architecture) trains on noise while its losses look healthy.

``check_at_start`` samples a few tokens of a few held-out prompts through the run's generator,
recomputes them on the trainer and compares (``mismatch_metrics``: mean and max |gap|, the
per-token k3 estimate of KL(generator || trainer)). Above ``parity.max_mismatch_kl`` the run
stops with :class:`PolicyMismatchError` before any update, naming the likely cause.
``ParityWatch`` then reads each on-policy step's ``mismatch_kl`` and stops the run when it
stays above the threshold for ``parity.patience`` steps in a row.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ParityConfig",
    "ParityWatch",
    "PolicyMismatchError",
    "check_at_start",
    "likely_cause",
    "precisions",
]


class PolicyMismatchError(RuntimeError):
    """The generator's and the trainer's logprobs of the same tokens disagree past the
    configured bound (``parity.max_mismatch_kl``)."""


@dataclass
class ParityConfig:
    """Generator-against-trainer agreement on the policy's own samples."""

    check_at_start: bool = True
    """Before the first step, compare both computations on a few sampled tokens and refuse to
    train above ``max_mismatch_kl``."""
    max_mismatch_kl: float = 0.02
    """The bound on the per-token k3 KL(generator || trainer) of sampled tokens. float32 on
    both sides agrees to ~1e-6; a bfloat16 generator stays well below this bound."""
    patience: int = 3
    """On-policy steps in a row above ``max_mismatch_kl`` after which the run stops with
    ``PolicyMismatchError`` (0: log only). Off-policy rows (``max_policy_age`` > 0) also
    differ by the policy's lag, so the watch runs only on-policy."""
    prompts: int = 2
    """Held-out prompts (or sampled ones, when the data has no held-out set) at the start."""
    tokens: int = 8
    """Tokens sampled per completion at the start (two completions per prompt)."""

    def __post_init__(self) -> None:
        if not self.max_mismatch_kl > 0:
            raise ValueError(f"parity.max_mismatch_kl must be > 0, got {self.max_mismatch_kl}")
        for name in ("patience", "prompts", "tokens"):
            value = getattr(self, name)
            if value < (0 if name == "patience" else 1):
                raise ValueError(f"parity.{name} must be >= {int(name != 'patience')}")


def likely_cause(metrics: dict[str, float], generator: str, trainer: str) -> str:
    """A sentence naming what most likely makes the two computations differ.

    ``generator`` / ``trainer``: the precision each computes in (e.g. ``float32``,
    ``bfloat16``, ``float32 with bfloat16 autocast``)."""
    if "float32" == generator == trainer:
        return (
            "both compute in float32, so precision cannot explain it: the generator's path "
            "differs from the model's own forward for this architecture (a cache or mask the "
            "engine mishandles, a post-scaled head); `forge models check MODEL` compares them "
            "on one prompt, and an unverified family belongs in docs/models.md's table first"
        )
    return (
        f"the generator computes in {generator} and the trainer in {trainer}: run both in "
        "float32 (generator.dtype: float32, trainer.autocast: false) to see whether precision "
        "is the cause; if the gap stays, the generator's path differs from the model's own "
        "forward (`forge models check MODEL`)"
    )


def precisions(cfg: Any) -> tuple[str, str]:
    """What the run's generator and trainer compute in, as ``likely_cause`` names them
    (``auto``, which each role decides on its own host, is named as such)."""
    where = " where its host has native bf16"
    trainer = cfg.trainer.dtype
    if cfg.trainer.autocast == "auto":
        trainer += f" with bfloat16 autocast{where}"
    elif cfg.trainer.autocast:
        trainer += f" with {cfg.trainer.autocast} autocast"
    generator = cfg.generator.dtype
    if generator == "auto":
        generator = f"bfloat16{where} (else float32)"
    return generator, trainer


def _describe(m: dict[str, float]) -> str:
    return (
        f"mismatch_kl {m['mismatch_kl']:.3g} per token, logprob gap mean "
        f"{m['logprob_gap']:.3g} max {m['logprob_gap_max']:.3g}"
    )


async def check_at_start(cfg: Any, data: Any, generator: Any, trainer: Any) -> dict[str, float]:
    """Sample ``cfg.parity.tokens`` tokens of a few prompts on ``generator`` (a service),
    recompute their logprobs on ``trainer`` and return ``mismatch_metrics``; raise
    ``PolicyMismatchError`` above ``cfg.parity.max_mismatch_kl``."""
    from forge.replay import collate_episodes
    from forge.training.trainer_core import mismatch_metrics
    from forge.types import Episode

    p = cfg.parity
    prompts = [row["prompt"] for row in (await data.heldout.call_one())[: p.prompts]]
    while len(prompts) < p.prompts:
        prompts.append((await data.sample.call_one())["prompt"])
    groups = await asyncio.gather(
        *(
            generator.generate.route(
                prompt, n=2, max_tokens=p.tokens, temperature=cfg.policy.temperature
            )
            for prompt in prompts
        )
    )
    episodes = [
        Episode(f"parity{i}", c.prompt_ids, c.token_ids, c.logprobs, 0.0, c.generator_version)
        for i, c in enumerate(c for group in groups for c in group)
    ]
    batch = collate_episodes(episodes)
    lp_bt = await trainer.logprobs.call_one(batch)
    metrics = mismatch_metrics(lp_bt, batch.behavior_logprobs_bt, batch.response_mask_bt)
    print(f"[forge] parity at start: {_describe(metrics)}", flush=True)
    if all(isinstance(x, str) for x in prompts) and not any(cfg.generator.sampling.stop):
        print(
            "[forge] note: plain-text prompts and no generator.sampling.stop: a base model "
            "writes on past its answer (the next question, ...) until max_tokens, and a reward "
            "that reads the last number then scores the wrong one; stop at the answer's end, "
            "e.g. generator.sampling.stop: ['\\n']",
            flush=True,
        )
    if metrics["mismatch_kl"] > p.max_mismatch_kl:
        raise PolicyMismatchError(
            f"the generator's and the trainer's logprobs of the same sampled tokens disagree "
            f"({_describe(metrics)}; bound parity.max_mismatch_kl={p.max_mismatch_kl}); "
            f"training on them would skew every ratio. Likely cause: "
            f"{likely_cause(metrics, *precisions(cfg))}. Raise the bound only if this gap is "
            "expected."
        )
    return metrics


class ParityWatch:
    """Counts on-policy steps whose ``mismatch_kl`` exceeds the bound; raises
    ``PolicyMismatchError`` after ``patience`` in a row."""

    def __init__(self, run_cfg: Any):
        self.cfg: ParityConfig = run_cfg.parity
        self.on_policy = run_cfg.max_policy_age == 0
        self.precisions = precisions(run_cfg)
        self.above = 0

    def observe(self, step: int, metrics: dict[str, float]) -> None:
        kl = metrics.get("mismatch_kl")
        if not self.on_policy or not self.cfg.patience or kl is None:
            return
        self.above = self.above + 1 if kl > self.cfg.max_mismatch_kl else 0
        if self.above >= self.cfg.patience:
            raise PolicyMismatchError(
                f"step {step}: mismatch_kl stayed above parity.max_mismatch_kl="
                f"{self.cfg.max_mismatch_kl} for {self.above} on-policy steps (now "
                f"{_describe(metrics)}). Likely cause: {likely_cause(metrics, *self.precisions)}"
            )
