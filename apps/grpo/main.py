"""GRPO: sample groups of completions, score them, train on group-relative advantages.

    forge run --config apps/grpo/configs/qwen3_1_7b.yaml          # GPUs: vllm + titan
    forge run --config apps/sumdigits/cpu.yaml                      # CPU demo (SFT, then this)

    DatasetActor ──prompt──▶ Generator (service) ──completions──▶ RewardActor (service)
                                 ▲                                      │ components
                   update_weights│   (ReferenceModel service: ref logprobs, if configured)
                                 │   (Teacher service: distillation advantages, if configured)
                                 │                                      ▼ aggregate, advantages
    Trainer ──push_weights(v)────┘ ◀──── sample(v) ──── ReplayBuffer ◀── filter ── groups

Every part a user brings is a slot (``forge.slots``): data source, reward functions (dicts
of named components allowed), their aggregation, group filter, advantage estimator, loss,
KL estimator, environment and tools, all resolved when the config loads. Rollouts run
continuously (``RolloutManager``) at most ``max_policy_age`` versions ahead of the trainer;
with ``placement.colocate`` the generator and trainer take turns on one device instead
(``forge.run.colocate``: the generator sleeps while the trainer steps). This file is the
loop; scoring, weight sync, batches, metrics, checkpoints and restarts are ``forge``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from forge import (
    ActorMetrics,
    Checkpointer,
    Colocation,
    Critic,
    DatasetActor,
    Distiller,
    EnvActor,
    EpisodeScorer,
    Evaluator,
    GAECritic,
    Generator,
    GroupScorer,
    M,
    MetricLog,
    ParityWatch,
    PhaseTracker,
    ReferenceModel,
    ReplayBuffer,
    ReplayBufferConfig,
    RewardActor,
    RewardModel,
    RLConfig,
    Roles,
    RolloutManager,
    Supervisor,
    Teachers,
    Trainer,
    WeightSync,
    actor_env_vars,
    check_parity,
    load_tokenizer,
    progress,
    progress_fields,
    spawn_teachers,
    step_row,
    train_batch,
)

T = TypeVar("T")


@dataclass
class Config(RLConfig):
    """The GRPO run: ``RLConfig`` (policy, roles, rollouts, evaluation, checkpoints) is all."""


@dataclass
class Handles:
    """The run's actors and services, typed by their actor classes; ``None``: not configured."""

    data: DatasetActor
    generator: Generator
    rewards: RewardActor | None
    buffer: ReplayBuffer
    trainer: Trainer
    envs: EnvActor | None
    reward_model: RewardModel | None
    reference: ReferenceModel | None
    critic: Critic | None
    teacher: Teachers | None


async def spawn(cfg: Config, roles: Roles) -> Handles:
    """Start the run's actors and services in parallel, one task named after each role; a
    role the config leaves out starts nothing and its handle is ``None``."""
    env_vars = actor_env_vars(cfg.threads_per_actor, cfg.deterministic)
    replicas = cfg.replicas
    buffer_config = ReplayBufferConfig(
        batch_size=cfg.rollout.episodes_per_step // cfg.trainer_procs,
        dp_size=cfg.trainer_procs,
        max_policy_age=cfg.max_policy_age,
        seed=cfg.seed,
    )
    data = start("data", DatasetActor.options(env_vars=env_vars).as_actor(cfg.data))
    generator = start(
        "generator",
        Generator.options(
            num_replicas=replicas.generator, env_vars=env_vars, **cfg.gpu_options("generator")
        ).as_service(cfg.generator),
    )
    buffer = start("buffer", ReplayBuffer.options(env_vars=env_vars).as_actor(buffer_config))
    trainer = start(
        "trainer",
        Trainer.options(
            procs=cfg.trainer_procs, env_vars=env_vars, **cfg.gpu_options("trainer")
        ).as_actor(cfg.trainer),
    )
    rewards = envs = reward_model = reference = critic = teacher = None
    if cfg.rewards:
        rewards = start(
            "rewards",
            RewardActor.options(num_replicas=replicas.rewards, env_vars=env_vars).as_service(
                cfg.reward_fns()
            ),
        )
    if cfg.env is not None and replicas.env:  # 0 replicas: episodes step in this process
        envs = start(
            "envs",
            EnvActor.options(num_replicas=replicas.env, env_vars=env_vars).as_service(cfg.env.fn),
        )
    if cfg.reward_model is not None:
        reward_model = start(
            "reward_model",
            RewardModel.options(num_replicas=replicas.reward_model, env_vars=env_vars).as_service(
                cfg.reward_model
            ),
        )
    if (reference_config := cfg.reference_service) is not None:
        reference = start(
            "reference", ReferenceModel.options(env_vars=env_vars).as_service(reference_config)
        )
    if cfg.critic is not None:
        critic = start("critic", Critic.options(env_vars=env_vars).as_actor(cfg.critic))
    if cfg.teacher is not None:
        teacher = start("teacher", spawn_teachers(cfg, env_vars))
    optional = (rewards, envs, reward_model, reference, critic, teacher)
    await asyncio.gather(data, generator, buffer, trainer, *(t for t in optional if t))
    handles = Handles(
        data=data.result(),
        generator=generator.result(),
        rewards=rewards and rewards.result(),
        buffer=buffer.result(),
        trainer=trainer.result(),
        envs=envs and envs.result(),
        reward_model=reward_model and reward_model.result(),
        reference=reference and reference.result(),
        critic=critic and critic.result(),
        teacher=teacher and teacher.result(),
    )
    roles.watch(handles.trainer, "trainer")  # what a checkpoint restores
    roles.watch(handles.buffer, "buffer")
    roles.watch(handles.data, "data")
    return handles


def start(role: str, handle: Awaitable[T]) -> asyncio.Task[T]:
    """A task that waits for ``handle``, named ``spawn <role>``: a start that hangs shows
    under that name in a task dump (``kill -USR1``, ``controller.task_dump``)."""

    async def ready() -> T:
        return await handle

    return asyncio.create_task(ready(), name=f"spawn {role}")


async def train(
    cfg: Config, run_dir: Path, resume: bool = False, roles: Roles | None = None
) -> dict:
    """Run GRPO; returns ``{"history": [...], "eval": {step: score}, "version": v, "model":
    <run_dir>/model}`` (the final policy, an HF directory)."""
    handles = await spawn(cfg, roles or Roles())
    log = MetricLog(run_dir, cfg.metrics, cfg.steps)
    checkpoints = Checkpointer(run_dir, cfg.checkpoint_every, cfg.checkpoint_keep_last)
    state = (handles.trainer, handles.buffer, handles.data)
    version = await checkpoints.restore(*state) if resume else 0
    scorer, manager = rollouts(cfg, handles, log)
    sync = WeightSync(
        handles.trainer,
        handles.generator,
        handles.reference,
        teacher=handles.teacher.follower if handles.teacher else None,
        log=log,
        on_served=manager.advance,
        on_failed=manager.fail,
        overlap=cfg.max_policy_age > 0,
    )
    if version:
        await sync.resume(version)
    actor_metrics = ActorMetrics(log, handles.trainer, handles.generator, handles.buffer)
    critic = None
    if handles.critic is not None and cfg.critic is not None:
        critic = GAECritic(handles.critic, cfg.critic, cfg.whiten_advantages)
    heldout = await handles.data.heldout.call_one()
    evaluate = Evaluator.of_run(cfg, scorer, handles.generator, heldout, log, before=sync.wait)
    if cfg.parity.check_at_start and not resume:  # before any update
        await check_parity(cfg, handles.data, handles.generator, handles.trainer)
    parity = ParityWatch(cfg)
    if cfg.eval.at_start and not resume:
        await evaluate(version)
    phases, first_step = PhaseTracker(cfg.phases, cfg.trainer.loss), version
    colocation = Colocation.of(cfg.placement, handles.trainer, handles.generator, log)
    if colocation is not None:  # None: generator and trainer on devices of their own
        await colocation.start()  # the optimizer state to host while the first rollouts run
    manager.version = version
    manager.start()
    bar = progress(range(version, cfg.steps), "grpo")
    try:
        for _ in bar:
            phase = phases.current(version) if version == first_step else phases.changes(version)
            if phase is not None:  # a scheduled switch of loss / KL / rollout settings
                bar.write(f"[grpo] step {version}: {phase.describe()}")
                await handles.trainer.set_loss.call(phase.loss)
                scorer.switch(phase.rollout, manager)
                log.add(M.PHASE, [float(phase.index)])
            metrics, waited, took = await train_batch(
                cfg, handles.buffer, handles.trainer, version, manager, critic, colocation
            )
            parity.observe(version, metrics)
            push_start, version = time.perf_counter(), version + 1
            log.cut("rollout/")  # this step's rollouts end here: the push starts the next's
            await sync.push(version)  # off the trainer's path when rollouts may be a version old
            if colocation is not None:
                await colocation.to_generate()  # the generator (asleep) has the new weights
            row = step_row(metrics, waited, took, time.perf_counter() - push_start)
            row = log.step(version, {**row, **await actor_metrics.step_fields()})
            bar.set_postfix(progress_fields(row, metrics))
            if cfg.eval.every and version % cfg.eval.every == 0:
                await evaluate(version)
            await checkpoints.maybe_save(version, *state)
    except BaseException:
        sync.cancel()  # failing: the error matters, not these
        actor_metrics.cancel()
        raise
    finally:
        bar.close()
        await manager.stop()
    await sync.wait()
    await actor_metrics.finish(version)
    if cfg.eval.at_end and version not in evaluate.scores:
        await evaluate(version)
    await handles.trainer.export_hf.call(str(run_dir / "model"))  # the final policy, every run
    log.close()
    return {
        "history": log.history,
        "eval": evaluate.scores,
        "version": version,
        "model": run_dir / "model",
    }


def rollouts(
    cfg: Config, handles: Handles, log: MetricLog
) -> tuple[GroupScorer | EpisodeScorer, RolloutManager]:
    """The group producer (scored completions, or episodes) and its rollout manager."""
    distill = None
    if cfg.teacher is not None:
        distill = Distiller(cfg.teacher, handles.teacher, log)
    scorer = GroupScorer(
        cfg.rollout,
        cfg.policy.temperature,
        handles.data,
        handles.generator,
        handles.rewards,
        log=log,
        reference=handles.reference,
        reward_model=handles.reward_model,
        distill=distill,
    )
    if cfg.env is None:
        producer = scorer
    else:
        bootstrap = cfg.critic is not None and cfg.critic.bootstrap_truncated
        tokenizer = load_tokenizer(cfg.policy.model)
        producer = EpisodeScorer(scorer, cfg.env, handles.envs, tokenizer, bootstrap)
    manager = RolloutManager(
        producer.produce,
        handles.buffer.add.call_one,
        **producer.manager_kwargs(cfg.max_policy_age),
    )
    return producer, manager


async def stage(cfg: Config, run_dir: Path, resume: bool) -> dict:
    """This app as a stage of a pipeline (``forge.run.pipeline``): GRPO with restarts."""
    supervisor = Supervisor(run_dir, cfg.checkpoint_every, cfg.restart_on_failure)
    return await supervisor.run(train, cfg, run_dir, resume)


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await stage(cfg, run_dir, resume)
    print(
        f"[grpo] done: version {result['version']}, held-out {result['eval']}, "
        f"policy in {result['model']}"
    )
