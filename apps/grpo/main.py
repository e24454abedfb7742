"""GRPO: sample groups of completions, score them, train on group-normalised advantages.

Run:
    forge run --config apps/grpo/configs/qwen3_1_7b.yaml          # GPUs: vllm + titan
    forge run --config apps/sumdigits/cpu.yaml                      # CPU demo (SFT, then this)
    python -m apps.grpo.main --config <yaml> [a.b=c ...]

    DatasetActor ──prompt──▶ Generator (service) ──completions──▶ RewardActor (service)
                                 ▲                                      │ rewards, advantages
                   update_weights│   (ReferenceModel service: ref logprobs, if kl_coef > 0)
                                 │                                      ▼
    Trainer ──push_weights(v)────┘ ◀──── sample(v) ──── ReplayBuffer ◀── episodes

Rollout tasks run continuously; the training loop takes a batch, steps, pushes version v+1
and updates every generator replica in flight. Asynchrony is bounded: rollouts may run at most
``max_policy_age`` versions ahead of the trainer (0 = on-policy), the buffer refuses older
episodes, and the loss corrects the generator/trainer mismatch with TIS when configured.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from apps.grpo.data import DataConfig, DatasetActor, build_rewards
from apps.grpo.state import Checkpointer, MetricLog, actor_env
from forge.actors.generator import Generator
from forge.actors.reference_model import ReferenceModel
from forge.actors.replay_buffer import ReplayBuffer, ReplayBufferConfig
from forge.actors.reward import RewardActor
from forge.actors.trainer import Trainer
from forge.generation import GeneratorConfig
from forge.rollout import group_episodes, heldout_accuracy
from forge.training.config import ReferenceConfig, TrainerConfig


@dataclass
class RolloutConfig:
    prompts_per_step: int = 16  # groups per training step
    group_size: int = 8
    max_tokens: int = 8
    temperature: float = 1.0
    tasks: int = 4  # concurrent rollout loops
    drop_zero_variance: bool = True  # all-equal rewards carry no GRPO signal


@dataclass
class EvalConfig:
    at_start: bool = True
    at_end: bool = True
    every: int = 0
    max_tokens: int = 8


@dataclass
class Config:
    app: str
    model: str
    generator: GeneratorConfig
    trainer: TrainerConfig
    steps: int = 100
    max_policy_age: int = 1
    num_generators: int = 1
    trainer_procs: int = 1
    data: DataConfig = field(default_factory=DataConfig)
    rewards: list[str] = field(default_factory=lambda: ["sumdigits"])
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reference: ReferenceConfig | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    metrics: list[str] = field(default_factory=lambda: ["jsonl"])
    checkpoint_every: int = 0
    threads_per_actor: int = 1
    seed: int = 0


async def train(cfg: Config, run_dir: Path, resume: bool = False) -> dict:
    """Run GRPO; returns ``{"history": [...], "eval": {step: accuracy}}``."""
    env = actor_env(cfg.threads_per_actor)
    reward_fns = build_rewards(cfg.rewards)
    dp = cfg.trainer_procs
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if per_step % dp:
        raise ValueError(
            f"prompts_per_step*group_size={per_step} must divide by trainer_procs={dp}"
        )
    buf_cfg = ReplayBufferConfig(
        batch_size=per_step // dp, dp_size=dp, max_policy_age=cfg.max_policy_age, seed=cfg.seed
    )
    data, generator, rewards, buffer, trainer = await asyncio.gather(
        DatasetActor.options(env=env).as_actor(cfg.data),
        Generator.options(num_replicas=cfg.num_generators, env=env).as_service(cfg.generator),
        RewardActor.options(num_replicas=1, env=env).as_service(reward_fns),
        ReplayBuffer.options(env=env).as_actor(buf_cfg),
        Trainer.options(procs=dp, env=env).as_actor(cfg.trainer),
    )
    reference = None
    if cfg.reference is not None:
        reference = await ReferenceModel.options(num_replicas=1, env=env).as_service(cfg.reference)

    ckpt = Checkpointer(run_dir, cfg.checkpoint_every)
    log = MetricLog(run_dir, cfg.metrics)
    version = await ckpt.restore(trainer, buffer, data) if resume else 0
    if version:
        handle = (await trainer.push_weights.call(version)).item(procs=0)
        await generator.update_weights.fanout(version, handle)
    heldout = await data.heldout.call_one()
    evals: dict[int, float] = {}

    async def evaluate(step: int) -> None:
        acc = await heldout_accuracy(
            generator.generate.route, heldout, reward_fns[0], cfg.eval.max_tokens
        )
        evals[step] = acc
        log.record(step, {"eval/heldout_accuracy": acc})

    if cfg.eval.at_start and not resume:
        await evaluate(version)

    # Rollouts may run at most max_policy_age versions ahead: one credit = one group.
    credits = asyncio.Semaphore(cfg.rollout.prompts_per_step * (cfg.max_policy_age + 1))
    # Zero-variance groups are dropped, but never so many that training starves (a model
    # that always fails, or always succeeds, still steps).
    drops = {"since_step": 0, "limit": 4 * cfg.rollout.prompts_per_step}

    async def rollout_loop() -> None:
        while True:
            await credits.acquire()
            item = await data.sample.call_one()
            completions = await generator.generate.route(
                item["prompt"],
                n=cfg.rollout.group_size,
                max_tokens=cfg.rollout.max_tokens,
                temperature=cfg.rollout.temperature,
            )
            scored = await rewards.evaluate_batch.route(
                [(item["prompt"], c.text, item["target"]) for c in completions]
            )
            group = group_episodes(completions, [s.total for s in scored], item["target"])
            log.add("rollout/reward", [e.reward for e in group])
            zero_var = len({e.reward for e in group}) == 1
            log.add("rollout/zero_variance_groups", [float(zero_var)])
            if zero_var and cfg.rollout.drop_zero_variance and drops["since_step"] < drops["limit"]:
                drops["since_step"] += 1
                credits.release()  # nothing to learn from it; sample another prompt
                continue
            if reference is not None:
                refs = await reference.forward.route(group)
                for e, r in zip(group, refs):
                    e.ref_logprobs = r
            await buffer.add.call_one(group)

    tasks = [asyncio.create_task(rollout_loop()) for _ in range(cfg.rollout.tasks)]
    bar = tqdm(range(version, cfg.steps), desc="grpo", file=sys.stdout, dynamic_ncols=True)
    try:
        for _ in bar:
            t0 = time.perf_counter()
            batch = await _next_batch(buffer, version, tasks)
            t1 = time.perf_counter()
            m = (await trainer.train_step.call(batch)).item(procs=0)
            t2 = time.perf_counter()
            version += 1
            handle = (await trainer.push_weights.call(version)).item(procs=0)
            await generator.update_weights.fanout(version, handle)
            t3 = time.perf_counter()
            for _ in range(cfg.rollout.prompts_per_step):
                credits.release()
            drops["since_step"] = 0
            buf_m = await buffer.metrics.call_one()
            log.merge(await _actor_metrics(trainer, generator, buffer))
            stats = log.step(
                version,
                {
                    **{f"train/{k}": v for k, v in m.items()},
                    "train/tokens_per_s": m["tokens"] / max(t2 - t1, 1e-9),
                    "time/wait_batch_s": t1 - t0,
                    "time/train_s": t2 - t1,
                    "time/weight_sync_s": t3 - t2,
                    "time/step_s": t3 - t0,
                    "buffer/sampled_policy_age_mean": buf_m["replay/sampled_policy_age_mean"],
                    "buffer/evicted_stale": buf_m["replay/evicted_stale"],
                },
            )
            bar.set_postfix(
                reward=f"{stats.get('rollout/reward', 0):.3f}",
                loss=f"{m['loss']:.4f}",
                tok_s=f"{stats['train/tokens_per_s']:.0f}",
            )
            if cfg.eval.every and version % cfg.eval.every == 0:
                await evaluate(version)
            await ckpt.maybe_save(version, trainer, buffer, data)
    finally:
        bar.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if cfg.eval.at_end and version not in evals:
        await evaluate(version)
    log.close()
    return {"history": log.history, "eval": evals, "version": version}


async def _actor_metrics(trainer, generator, buffer) -> list[dict]:
    """Per-process metric states recorded since the last step (busy fractions, ...)."""
    parts = await asyncio.gather(
        trainer.flush_metrics.call(),
        generator.flush_metrics.fanout(),
        buffer.flush_metrics.call_one(),
    )
    return [*parts[0].values(), *parts[1], parts[2]]


async def _next_batch(buffer, version: int, tasks: list[asyncio.Task]):
    """Wait for the buffer to hold a batch usable at ``version``; surface rollout crashes."""
    while True:
        batch = await buffer.sample.call_one(version)
        if batch is not None:
            return batch
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise RuntimeError("a rollout task failed") from t.exception()
        await asyncio.sleep(0.005)


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await train(cfg, run_dir, resume)
    print(f"[grpo] done: version {result['version']}, held-out accuracy {result['eval']}")


if __name__ == "__main__":
    from forge.cli import main as forge_main

    sys.exit(forge_main(["run", *sys.argv[1:]]))
