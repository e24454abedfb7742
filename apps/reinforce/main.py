"""REINFORCE with a running baseline: a whole RL algorithm's app in one short file.

Run:
    forge run --config apps/reinforce/cpu.yaml

    DatasetActor ──prompts──▶ Generator ──completions──▶ RewardActor ──rewards──┐
         ▲                        ▲                                            │ - baseline
         └────── next step ───────┴── WeightSync ◀── Trainer.train_step ◀──────┘

On-policy and synchronous: each step samples ``prompts_per_step`` prompts, one completion
each, scores them, subtracts an exponential moving average of past rewards (Williams, 1992)
and takes one policy-gradient step (loss ``reinforce``); the generators then load the new
weights. No replay buffer, no groups: everything else (config, metrics, weight sync,
evaluation, progress) is Forge's, the same pieces ``apps/grpo`` uses.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from forge import (
    DatasetActor,
    Evaluator,
    Generator,
    GroupScorer,
    MetricLog,
    RewardActor,
    RLConfig,
    Trainer,
    WeightSync,
    actor_env,
    collate_episodes,
    load_tokenizer,
    progress,
    step_row,
)


@dataclass
class Config(RLConfig):
    """An RL run (``forge.RLConfig``; ``rollout.prompts_per_step`` completions per step,
    ``rollout.group_size`` must be 1) plus the baseline's decay."""

    baseline_decay: float = 0.9
    group_advantages: ClassVar[bool] = False  # the running baseline gives the advantages

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rollout.group_size != 1 or self.max_policy_age != 0:
            raise ValueError("reinforce is on-policy with one completion per prompt: set "
                             "rollout.group_size=1 and max_policy_age=0")  # fmt: skip
        if self.placement.colocate:
            raise ValueError("placement.colocate: this app's loop does not time-slice the "
                             "device; use apps.grpo.main, or placement memory shares")  # fmt: skip


async def train(cfg: Config, run_dir: Path, resume: bool = False, roles=None) -> dict:
    """Run REINFORCE; returns ``{"history", "eval", "version"}`` like the GRPO app."""
    env = actor_env(cfg.threads_per_actor, cfg.deterministic)
    data, generator, rewards, trainer = await asyncio.gather(
        DatasetActor.options(env=env).as_actor(cfg.data),
        Generator.options(num_replicas=cfg.replicas.generator, env=env).as_service(cfg.generator),
        RewardActor.options(num_replicas=cfg.replicas.rewards, env=env).as_service(cfg.reward_fns()),
        Trainer.options(env=env).as_actor(cfg.trainer),
    )  # fmt: skip
    log, pad = (
        MetricLog(run_dir, cfg.metrics, cfg.steps),
        load_tokenizer(cfg.policy.model).pad_token_id,
    )
    sync = WeightSync(trainer, generator, log=log, overlap=False)
    scorer = GroupScorer(cfg.rollout, cfg.policy.temperature, data, generator, rewards, log=log)
    evaluate = Evaluator(scorer, generator, await data.heldout.call_one(), cfg.eval_reward_fn(),
                         cfg.eval.max_tokens, log)  # fmt: skip
    if cfg.eval.at_start:
        await evaluate(0)
    baseline = None
    for version in progress(range(cfg.steps), "reinforce"):
        t0 = time.perf_counter()
        groups = await asyncio.gather(
            *(scorer.produce() for _ in range(cfg.rollout.prompts_per_step))
        )
        episodes = [e for g in groups for e in g]
        mean = sum(e.reward for e in episodes) / len(episodes)
        baseline = mean if baseline is None else baseline
        for e in episodes:  # the policy gradient's weight: how much better than usual
            e.advantage = e.reward - baseline
        t1 = time.perf_counter()
        m = (await trainer.train_step.call(collate_episodes(episodes, pad or 0))).item(procs=0)
        t2 = time.perf_counter()
        await sync.push(version + 1)
        log.step(version + 1, step_row(m, t1 - t0, t2 - t1, time.perf_counter() - t2))
        baseline = cfg.baseline_decay * baseline + (1 - cfg.baseline_decay) * mean
        if cfg.eval.every and (version + 1) % cfg.eval.every == 0:
            await evaluate(version + 1)
    if cfg.eval.at_end and cfg.steps not in evaluate.scores:
        await evaluate(cfg.steps)
    log.close()
    return {"history": log.history, "eval": evaluate.scores, "version": cfg.steps}


async def stage(cfg: Config, run_dir: Path, resume: bool) -> dict:
    return await train(cfg, run_dir, resume)


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await stage(cfg, run_dir, resume)
    print(f"[reinforce] done: version {result['version']}, held-out accuracy {result['eval']}")
