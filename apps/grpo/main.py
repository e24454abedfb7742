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
from dataclasses import dataclass
from pathlib import Path

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
    spawn_teachers,
    step_row,
    train_batch,
)


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
    """Start the run's actors and services, in parallel."""
    env_vars, n = actor_env_vars(cfg.threads_per_actor, cfg.deterministic), cfg.replicas
    buffer_cfg = ReplayBufferConfig(
        batch_size=cfg.rollout.episodes_per_step // cfg.trainer_procs,
        dp_size=cfg.trainer_procs,
        max_policy_age=cfg.max_policy_age,
        seed=cfg.seed,
    )

    def maybe(needed, make):
        return make() if needed else asyncio.sleep(0)

    parts: list = await asyncio.gather(  # in the order of Handles' fields
        DatasetActor.options(env_vars=env_vars).as_actor(cfg.data),
        Generator.options(
            num_replicas=n.generator, env_vars=env_vars, **cfg.gpu_options("generator")
        ).as_service(cfg.generator),
        maybe(
            cfg.rewards,
            lambda: RewardActor.options(num_replicas=n.rewards, env_vars=env_vars).as_service(
                cfg.reward_fns()
            ),
        ),
        ReplayBuffer.options(env_vars=env_vars).as_actor(buffer_cfg),
        Trainer.options(
            procs=cfg.trainer_procs, env_vars=env_vars, **cfg.gpu_options("trainer")
        ).as_actor(cfg.trainer),
        maybe(
            n.env,
            lambda: EnvActor.options(num_replicas=n.env, env_vars=env_vars).as_service(cfg.env.fn),
        ),
        maybe(
            cfg.reward_model,
            lambda: RewardModel.options(num_replicas=n.reward_model, env_vars=env_vars).as_service(
                cfg.reward_model
            ),
        ),
        maybe(
            ref := cfg.reference_service,
            lambda: ReferenceModel.options(env_vars=env_vars).as_service(ref),
        ),
        maybe(cfg.critic, lambda: Critic.options(env_vars=env_vars).as_actor(cfg.critic)),
        maybe(cfg.teacher, lambda: spawn_teachers(cfg, env_vars)),
    )
    h = Handles(*parts)
    for role, handle in (("trainer", h.trainer), ("buffer", h.buffer), ("data", h.data)):
        roles.watch(handle, role)  # what a checkpoint restores
    return h


async def train(cfg: Config, run_dir: Path, resume: bool = False, roles=None) -> dict:
    """Run GRPO; returns ``{"history": [...], "eval": {step: score}, "version": v, "model":
    <run_dir>/model}`` (the final policy, an HF directory)."""
    s = await spawn(cfg, roles or Roles())
    log = MetricLog(run_dir, cfg.metrics, cfg.steps)
    ckpt = Checkpointer(run_dir, cfg.checkpoint_every, cfg.checkpoint_keep_last)
    state = (s.trainer, s.buffer, s.data)
    version = await ckpt.restore(*state) if resume else 0
    scorer, manager = rollouts(cfg, s, log)
    sync = WeightSync(
        s.trainer,
        s.generator,
        s.reference,
        teacher=s.teacher.follower if s.teacher else None,
        log=log,
        on_served=manager.advance,
        on_failed=manager.fail,
        overlap=cfg.max_policy_age > 0,
    )
    if version:
        await sync.resume(version)
    flush = ActorMetrics(log, s.trainer, s.generator, s.buffer)
    critic = GAECritic(s.critic, cfg.critic, cfg.whiten_advantages) if cfg.critic else None
    evaluate = Evaluator.of_run(
        cfg, scorer, s.generator, await s.data.heldout.call_one(), log, before=sync.wait
    )
    if cfg.parity.check_at_start and not resume:
        await check_parity(cfg, s.data, s.generator, s.trainer)  # before any update
    parity = ParityWatch(cfg)
    if cfg.eval.at_start and not resume:
        await evaluate(version)
    phases, start = PhaseTracker(cfg.phases, cfg.trainer.loss), version
    colo = Colocation.of(cfg.placement, s.trainer, s.generator, log)  # None: not colocated
    if colo is not None:
        await colo.start()  # the optimizer state to host while the first rollouts run
    manager.version = version
    manager.start()
    bar = progress(range(version, cfg.steps), "grpo")
    try:
        for _ in bar:
            phase = phases.current(version) if version == start else phases.changes(version)
            if phase is not None:  # a scheduled switch of loss / KL / rollout settings
                bar.write(f"[grpo] step {version}: {phase.describe()}")
                await s.trainer.set_loss.call(phase.loss)
                scorer.switch(phase.rollout, manager)
                log.add(M.PHASE, [float(phase.index)])
            m, waited, took = await train_batch(
                cfg, s.buffer, s.trainer, version, manager, critic, colo
            )
            parity.observe(version, m)
            t, version = time.perf_counter(), version + 1
            log.cut("rollout/")  # this step's rollouts end here: the push starts the next's
            await sync.push(version)  # off the trainer's path when rollouts may be a version old
            if colo is not None:
                await colo.to_generate()  # the generator (asleep) has the new weights: wake it
            row = step_row(m, waited, took, time.perf_counter() - t)
            row = log.step(version, {**row, **await flush.step_fields()})
            bar.set_postfix(reward=f"{row.get(M.REWARD, 0):.3f}", loss=f"{m['loss']:.4f}")
            if cfg.eval.every and version % cfg.eval.every == 0:
                await evaluate(version)
            await ckpt.maybe_save(version, *state)
    except BaseException:
        sync.cancel()  # failing: the error matters, not these
        flush.cancel()
        raise
    finally:
        bar.close()
        await manager.stop()
    await sync.wait()
    await flush.finish(version)
    if cfg.eval.at_end and version not in evaluate.scores:
        await evaluate(version)
    await s.trainer.export_hf.call(str(run_dir / "model"))  # the final policy, every run
    log.close()
    return {
        "history": log.history,
        "eval": evaluate.scores,
        "version": version,
        "model": run_dir / "model",
    }


def rollouts(cfg: Config, s: Handles, log: MetricLog) -> tuple:
    """The group producer (scored completions, or episodes) and its rollout manager."""
    distill = Distiller(cfg.teacher, s.teacher, log) if cfg.teacher is not None else None
    scorer = GroupScorer(
        cfg.rollout,
        cfg.policy.temperature,
        s.data,
        s.generator,
        s.rewards,
        log=log,
        reference=s.reference,
        reward_model=s.reward_model,
        distill=distill,
    )
    if cfg.env is not None:
        bootstrap = cfg.critic is not None and cfg.critic.bootstrap_truncated
        scorer = EpisodeScorer(scorer, cfg.env, s.envs, load_tokenizer(cfg.policy.model), bootstrap)
    manager = RolloutManager(
        scorer.produce, s.buffer.add.call_one, **scorer.manager_kwargs(cfg.max_policy_age)
    )
    return scorer, manager


async def stage(cfg: Config, run_dir: Path, resume: bool) -> dict:
    """This app as a stage of a pipeline (``forge.run.pipeline``): GRPO with restarts."""
    supervisor = Supervisor(run_dir, cfg.checkpoint_every, cfg.restart_on_failure)
    return await supervisor.run(train, cfg, run_dir, resume)


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    r = await stage(cfg, run_dir, resume)
    print(f"[grpo] done: version {r['version']}, held-out {r['eval']}, policy in {r['model']}")
