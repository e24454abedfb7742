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

from forge import (
    DatasetActor,
    Evaluator,
    Generator,
    GroupScorer,
    MetricLog,
    RewardActor,
    Roles,
    RolloutRunConfig,
    Trainer,
    WeightSync,
    actor_env_vars,
    collate_episodes,
    load_tokenizer,
    progress,
    step_row,
)


@dataclass(kw_only=True)
class Config(RolloutRunConfig):
    """A REINFORCE run: the shared run config with a generator, rewards, rollout and
    evaluation (``forge.RolloutRunConfig``; ``rollout.prompts_per_step`` completions per
    step, ``rollout.group_size`` must be 1), plus the baseline's decay. On-policy by
    construction: no ``max_policy_age``, and none of GRPO's reference, critic, environment,
    phases, checkpoints or streaming (setting them is an unknown-key error)."""

    baseline_decay: float = 0.9
    """The running baseline's EMA decay: ``b <- decay * b + (1 - decay) * mean reward``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rollout.group_size != 1:
            raise ValueError(
                "reinforce samples one completion per prompt (the running "
                "baseline replaces the group): set rollout.group_size=1"
            )
        if not 0.0 <= self.baseline_decay <= 1.0:
            raise ValueError(f"baseline_decay must be in [0, 1], got {self.baseline_decay}")


async def train(
    cfg: Config, run_dir: Path, resume: bool = False, roles: Roles | None = None
) -> dict:
    """Run REINFORCE; returns ``{"history", "eval", "version"}`` like the GRPO app."""
    env_vars = actor_env_vars(cfg.threads_per_actor, cfg.deterministic)
    data, generator, rewards, trainer = await asyncio.gather(
        DatasetActor.options(env_vars=env_vars).as_actor(cfg.data),
        Generator.options(num_replicas=cfg.replicas.generator, env_vars=env_vars).as_service(
            cfg.generator
        ),
        RewardActor.options(num_replicas=cfg.replicas.rewards, env_vars=env_vars).as_service(
            cfg.reward_fns()
        ),
        Trainer.options(env_vars=env_vars).as_actor(cfg.trainer),
    )
    log = MetricLog(run_dir, cfg.metrics, cfg.steps)
    pad_id = load_tokenizer(cfg.policy.model).pad_token_id or 0
    sync = WeightSync(trainer, generator, log=log, overlap=False)
    scorer = GroupScorer(cfg.rollout, cfg.policy.temperature, data, generator, rewards, log=log)
    evaluate = Evaluator(
        scorer,
        generator,
        await data.heldout.call_one(),
        cfg.eval_reward_fn(),
        cfg.eval.max_tokens,
        log,
    )
    if cfg.eval.at_start:
        await evaluate(0)
    baseline = None
    for version in progress(range(cfg.steps), "reinforce"):
        sampling_start = time.perf_counter()
        groups = await asyncio.gather(
            *(scorer.produce() for _ in range(cfg.rollout.prompts_per_step))
        )
        episodes = [episode for group in groups for episode in group]
        mean = sum(e.reward for e in episodes) / len(episodes)
        baseline = mean if baseline is None else baseline
        for e in episodes:  # the policy gradient's weight: how much better than usual
            e.advantage = e.reward - baseline
        train_start = time.perf_counter()
        batch = collate_episodes(episodes, pad_id)
        metrics = (await trainer.train_step.call(batch)).item(procs=0)
        push_start = time.perf_counter()
        await sync.push(version + 1)
        row = step_row(
            metrics,
            wait_s=train_start - sampling_start,
            train_s=push_start - train_start,
            sync_s=time.perf_counter() - push_start,
        )
        log.step(version + 1, row)
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
