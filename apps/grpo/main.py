"""GRPO: sample groups of completions, score them, train on group-relative advantages.

Run:
    forge run --config apps/grpo/configs/qwen3_1_7b.yaml          # GPUs: vllm + titan
    forge run --config apps/sumdigits/cpu.yaml                      # CPU demo (SFT, then this)
    python -m apps.grpo.main --config <yaml> [a.b=c ...]

    DatasetActor ──prompt──▶ Generator (service) ──completions──▶ RewardActor (service)
                                 ▲                                      │ components
                   update_weights│   (ReferenceModel service: ref logprobs, if configured)
                                 │                                      ▼ aggregate, advantages
    Trainer ──push_weights(v)────┘ ◀──── sample(v) ──── ReplayBuffer ◀── filter ── groups

Every part a user brings is a slot (``forge.slots``): the data source (``data``), reward
functions (``rewards``, which may return dicts of named components), their aggregation
(``reward_aggregator``: weighted_sum, min, pareto), the group filter, the advantage
estimator, the loss (``trainer.loss.type``) and KL estimator. In YAML each is a built-in
name, ``pkg.module:attr`` or ``{fn: ..., kwargs: {...}}``; all are resolved when the config
loads, before any process starts.

Rollouts run continuously (``forge.rollout.RolloutManager``) at most ``max_policy_age``
versions ahead of the trainer; groups that fail the filter are replaced while the step's
over-sampling budget lasts; groups in flight across a weight update carry over.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from apps.grpo.envs import EnvConfig, EpisodeScorer, heldout_success
from apps.grpo.ppo import check_ppo, train_critic, value_advantages
from apps.grpo.scoring import (
    GroupScorer,
    RolloutConfig,
    apply_rollout_overrides,
    check_rollout_overrides,
)
from apps.grpo.state import Checkpointer, MetricLog, actor_env
from apps.grpo.supervise import check_restarts, train_with_restarts
from forge.actors import (
    Critic,
    DatasetActor,
    EnvActor,
    Generator,
    ReferenceModel,
    ReplayBuffer,
    ReplayBufferConfig,
    RewardActor,
    RewardModel,
    Trainer,
)
from forge.generation import GeneratorConfig
from forge.models import load_tokenizer
from forge.models.reward_model import RewardModelConfig
from forge.plugins import Spec
from forge.rollout import RolloutManager, heldout_accuracy
from forge.slots import DATA_SOURCE, GROUP_FILTER, REWARD
from forge.training.config import ReferenceConfig, TrainerConfig
from forge.training.critic import CriticConfig
from forge.training.phases import PhaseConfig, PhaseTracker, validate_phases


@dataclass
class EvalConfig:
    at_start: bool = True
    at_end: bool = True
    every: int = 0
    max_tokens: int = 8
    reward: Spec | None = None  # scores held-out answers; default: the first of `rewards`


@dataclass
class Config:
    app: str
    model: str
    generator: GeneratorConfig
    trainer: TrainerConfig
    data: Spec
    rewards: list[Spec] = field(default_factory=list)  # (an env gives its own rewards)
    steps: int = 100
    max_policy_age: int = 1
    num_generators: int = 1
    trainer_procs: int = 1
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reference: ReferenceConfig | None = None
    env: EnvConfig | None = None  # multi-turn: rollouts are episodes in this environment
    reward_model: RewardModelConfig | None = None  # a learned reward: its score is a component
    reward_model_replicas: int = 1
    critic: CriticConfig | None = None  # PPO: a value model, GAE advantages per token
    whiten_advantages: bool = True  # with a critic: normalise GAE advantages per batch
    eval: EvalConfig = field(default_factory=EvalConfig)
    phases: list[PhaseConfig] = field(default_factory=list)  # loss/rollout switches by step
    metrics: list[str] = field(default_factory=lambda: ["jsonl"])
    checkpoint_every: int = 0
    restart_on_failure: int = 0  # restarts from the last checkpoint if the trainer dies
    reward_replicas: int = 1
    stream: bool = False  # trajectory streaming: train on a step's first groups early
    batch_timeout_s: float = 600.0  # no usable batch for this long: stop with a named error
    threads_per_actor: int = 0  # 0: the host thread budget (controller.threads); N: fixed
    seed: int = 0

    def __post_init__(self) -> None:
        # Resolve every user-supplied part now: a typo fails before anything spawns.
        DATA_SOURCE.validate(self.data, key="data")
        if not self.rewards and self.env is None:
            raise ValueError(
                f"rewards: give at least one reward function; built-ins: "
                f"{', '.join(REWARD.names())}"
            )
        for i, spec in enumerate(self.rewards):
            REWARD.validate(spec, key=f"rewards[{i}]")
        if self.eval.reward is not None:
            REWARD.validate(self.eval.reward, key="eval.reward")
        check_ppo(self.critic, self.trainer.loss.type)
        validate_phases(self.phases, self.trainer.loss)
        check_rollout_overrides(self.phases)
        check_restarts(self.restart_on_failure, self.checkpoint_every)
        per_step = self.rollout.prompts_per_step * self.rollout.group_size
        if self.stream and (self.trainer_procs != 1 or self.critic is not None):
            raise ValueError(
                "stream: trajectory streaming needs trainer_procs=1 and no critic (PPO values "
                f"need the whole batch); got trainer_procs={self.trainer_procs}, "
                f"critic={'set' if self.critic else 'none'}; set stream=false"
            )
        if per_step % self.trainer_procs:
            raise ValueError(
                f"prompts_per_step*group_size={per_step} must divide by "
                f"trainer_procs={self.trainer_procs}"
            )


async def train(cfg: Config, run_dir: Path, resume: bool = False) -> dict:
    """Run GRPO; returns ``{"history": [...], "eval": {step: accuracy}, "version": v}``."""
    env = actor_env(cfg.threads_per_actor)
    reward_fns = [REWARD.resolve(s) for s in cfg.rewards]
    eval_reward = [REWARD.resolve(cfg.eval.reward)] if cfg.eval.reward else reward_fns[:1]
    dp = cfg.trainer_procs
    per_step = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    buf_cfg = ReplayBufferConfig(
        batch_size=per_step // dp, dp_size=dp, max_policy_age=cfg.max_policy_age, seed=cfg.seed
    )
    data, generator, rewards, buffer, trainer = await asyncio.gather(
        DatasetActor.options(env=env).as_actor(cfg.data),
        Generator.options(num_replicas=cfg.num_generators, env=env).as_service(cfg.generator),
        RewardActor.options(num_replicas=cfg.reward_replicas, env=env).as_service(reward_fns)
        if reward_fns
        else _nothing(),
        ReplayBuffer.options(env=env).as_actor(buf_cfg),
        Trainer.options(procs=dp, env=env).as_actor(cfg.trainer),
    )
    reference = critic = reward_model = envs = None
    if cfg.env is not None and cfg.env.replicas:
        envs = await EnvActor.options(num_replicas=cfg.env.replicas, env=env).as_service(cfg.env.fn)
    if cfg.reward_model is not None:
        reward_model = await RewardModel.options(
            num_replicas=cfg.reward_model_replicas, env=env
        ).as_service(cfg.reward_model)
    if cfg.reference is not None:
        reference = await ReferenceModel.options(num_replicas=1, env=env).as_service(cfg.reference)
    if cfg.critic is not None:
        critic = await Critic.options(env=env).as_actor(cfg.critic)

    ckpt = Checkpointer(run_dir, cfg.checkpoint_every)
    log = MetricLog(run_dir, cfg.metrics, cfg.steps)
    version = await ckpt.restore(trainer, buffer, data) if resume else 0
    if version:
        handle = (await trainer.push_weights.call(version)).item(procs=0)
        await generator.update_weights.fanout(version, handle)
    heldout = await data.heldout.call_one()
    evals: dict[int, float] = {}

    scorer = GroupScorer(cfg.rollout, data, generator, rewards, reference, log, reward_model)
    episodes = None
    if cfg.env is not None:
        episodes = EpisodeScorer(scorer, cfg.env, envs, load_tokenizer(cfg.model))

    async def evaluate(step: int) -> None:
        if episodes is not None:  # multi-turn: greedy episodes, success rate and turns
            m = await heldout_success(episodes, heldout, cfg.eval.max_tokens)
            acc = m["success_rate"]
            log.record(step, {"eval/heldout_accuracy": acc, "eval/mean_turns": m["mean_turns"]})
        else:
            acc = await heldout_accuracy(
                generator.generate.route, heldout, eval_reward[0], cfg.eval.max_tokens
            )
            log.record(step, {"eval/heldout_accuracy": acc})
        evals[step] = acc

    if cfg.eval.at_start and not resume:
        await evaluate(version)

    r = cfg.rollout
    manager = RolloutManager(
        episodes.produce if episodes is not None else scorer.produce,
        buffer.add.call_one,
        groups_per_step=r.prompts_per_step,
        max_policy_age=cfg.max_policy_age,
        concurrency=r.tasks,
        filter_fn=GROUP_FILTER.resolve(r.filter, key="rollout.filter"),
        over_sampling_factor=r.over_sampling_factor,
        partial=r.partial,
        record=log.add,
    )
    manager.version = version
    manager.start()
    phases, start = PhaseTracker(cfg.phases, cfg.trainer.loss), version
    flush, buf_m = None, {}  # the in-flight actor-metrics flush, the buffer's last metrics
    sync = None  # the in-flight weight update of the generators (and a moving reference)
    bar = tqdm(range(version, cfg.steps), desc="grpo", file=sys.stdout, dynamic_ncols=True)
    try:
        for _ in bar:
            phase = phases.current(version) if version == start else phases.changes(version)
            if phase is not None:  # a scheduled switch of loss / KL / rollout settings
                bar.write(f"[grpo] step {version}: {phase.describe()}")
                await trainer.set_loss.call(phase.loss)
                apply_rollout_overrides(cfg.rollout, phase.rollout, scorer, manager)
                log.add("phase/index", [float(phase.index)])
            t0 = time.perf_counter()
            if cfg.stream:  # train on the step's first groups while the rest generate
                m, waited = await _streamed_step(buffer, trainer, version, manager, cfg)
                t1 = t0 + waited
            else:
                batch = await _next_batch(buffer, version, manager, cfg.batch_timeout_s)
                t1 = time.perf_counter()
                m = await _train(trainer, critic, batch, cfg)
            t2 = time.perf_counter()
            if sync is not None:  # the last version's pull ends before the next push reuses it
                await sync
            version += 1
            handle = (await trainer.push_weights.call(version)).item(procs=0)
            # The replicas pull the new weights, then rollouts for the next step start. Off the
            # trainer's path when rollouts may be a version old: its next batch is (mostly)
            # already in the buffer, so it trains while the generators load the weights.
            sync = asyncio.ensure_future(
                _sync_weights(generator, reference, manager, log, version, handle)
            )
            if cfg.max_policy_age == 0:
                await sync
            t3 = time.perf_counter()
            # Actor metrics travel off the critical path: this step's row merges what the
            # previous step's flush returned, and a new flush starts (the last one is awaited).
            if flush is not None:
                buf_m = await _merge_flush(flush, log)
            else:  # the run's first step: no flush yet, ask the buffer once
                buf_m = _buffer_fields(await buffer.metrics.call_one())
            flush = asyncio.ensure_future(_actor_metrics(trainer, generator, buffer))
            stats = log.step(
                version,
                {
                    **{f"train/{k}": v for k, v in m.items()},
                    "train/tokens_per_s": m["tokens"] / max(t2 - t1, 1e-9),
                    "time/wait_batch_s": t1 - t0,
                    "time/train_s": t2 - t1,
                    "time/weight_sync_s": t3 - t2,
                    "time/step_s": t3 - t0,
                    **buf_m,
                },
            )
            bar.set_postfix(
                reward=f"{stats.get('rollout/reward', 0):.3f}",
                loss=f"{m['loss']:.4f}",
                tok_s=f"{stats['train/tokens_per_s']:.0f}",
            )
            if cfg.eval.every and version % cfg.eval.every == 0:
                await sync
                await evaluate(version)
            await ckpt.maybe_save(version, trainer, buffer, data)
    finally:
        bar.close()
        await manager.stop()
        if sys.exc_info()[0] is not None:  # failing: the error matters, not these
            for pending in (flush, sync):
                if pending is not None:
                    pending.cancel()
    if sync is not None:
        await sync
    if flush is not None:  # the last step's actor metrics
        log.record_remote(version, await _merge_flush(flush, log))
    if cfg.eval.at_end and version not in evals:
        await evaluate(version)
    log.close()
    return {"history": log.history, "eval": evals, "version": version}


async def _nothing() -> None:
    """No reward service: the environment gives every reward."""


async def _sync_weights(generator, reference, manager, log, version: int, handle) -> None:
    """Every generator replica (and a moving reference) loads ``version``; then the rollout
    manager hands out the next step's credits, so new rollouts run on it."""
    log.status.served(await generator.update_weights.fanout_by_replica(version, handle))
    if reference is not None:  # a moving reference (EMA / reset) pulls it too
        await reference.update_weights.fanout(version, handle)
    manager.advance(version)


async def _actor_metrics(trainer, generator, buffer) -> tuple[list[dict], dict]:
    """Per-process metric states recorded since the last flush (busy fractions, ...) and the
    replay buffer's metrics, fetched concurrently."""
    parts = await asyncio.gather(
        trainer.flush_metrics.call(),
        generator.flush_metrics.fanout(),
        buffer.flush_metrics.call_one(),
        buffer.metrics.call_one(),
    )
    return [*parts[0].values(), *parts[1], parts[2]], parts[3]


async def _merge_flush(flush: asyncio.Future, log: MetricLog) -> dict:
    """Merge a finished (or awaited) flush into ``log``; returns the buffer metrics to log."""
    states, buf_m = await flush
    log.merge(states)
    return _buffer_fields(buf_m)


def _buffer_fields(buf_m: dict) -> dict:
    """The replay buffer's metrics as the step row logs them."""
    return {
        "buffer/sampled_policy_age_mean": buf_m["replay/sampled_policy_age_mean"],
        "buffer/evicted_stale": buf_m["replay/evicted_stale"],
    }


async def _train(trainer, critic, batch, cfg: Config) -> dict:
    """One training step on ``batch``; with a critic (PPO): values -> GAE -> the policy and
    critic updates side by side."""
    if critic is None:
        return (await trainer.train_step.call(batch)).item(procs=0)
    targets = await value_advantages(critic, batch, cfg.critic, cfg.whiten_advantages)
    trained, cm = await asyncio.gather(
        trainer.train_step.call(batch), train_critic(critic, batch, targets)
    )
    return {**trained.item(procs=0), **cm}


async def _streamed_step(buffer, trainer, version: int, manager: RolloutManager, cfg: Config):
    """Trajectory streaming: hand the trainer the step's episodes as they arrive (at least a
    quarter of the step's groups at a time), then step once. Returns (metrics, seconds spent
    waiting for episodes)."""
    r = cfg.rollout
    need = r.prompts_per_step * r.group_size
    chunk = r.group_size * max(1, r.prompts_per_step // 4)
    got, waited = 0, 0.0
    while got < need:
        t = time.perf_counter()
        part = None
        while part is None:
            part = await buffer.take.call_one(
                version, need - got, min(chunk, need - got), wait_s=0.5
            )
            if part is None:
                manager.check()
                if time.perf_counter() - t > cfg.batch_timeout_s:
                    await _starved(buffer, version, manager, cfg.batch_timeout_s)
        waited += time.perf_counter() - t
        await trainer.accumulate.call(part)
        got += part.input_ids_bt.shape[0]
    return (await trainer.apply_accumulated.call()).item(procs=0), waited


async def _next_batch(buffer, version: int, manager: RolloutManager, timeout_s: float):
    """Wait for the buffer to hold a batch usable at ``version``; surface rollout crashes,
    and give up with a named error after ``timeout_s`` seconds without one."""
    deadline = time.monotonic() + timeout_s
    while True:  # the buffer answers as soon as the batch is complete (or after 0.5 s)
        batch = await buffer.sample.call_one(version, wait_s=0.5)
        if batch is not None:
            return batch
        manager.check()
        if time.monotonic() > deadline:
            await _starved(buffer, version, manager, timeout_s)


async def _starved(buffer, version: int, manager: RolloutManager, timeout_s: float) -> None:
    """Raise the error for a training loop that got no usable batch in ``timeout_s``."""
    m = await buffer.metrics.call_one()
    raise TimeoutError(
        f"no batch usable at policy version {version} after {timeout_s:.0f} s "
        f"(batch_timeout_s): the replay buffer holds {m['replay/size']:.0f} episodes, "
        f"{m['replay/evicted_stale']:.0f} evicted as stale so far; rollouts: {manager.counts}. "
        "Generators serving weights older than max_policy_age produce only stale episodes; "
        "check the generators' versions (forge top) and the rollout errors above"
    )


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    result = await train_with_restarts(train, cfg, run_dir, resume)  # restart_on_failure
    print(f"[grpo] done: version {result['version']}, held-out accuracy {result['eval']}")


if __name__ == "__main__":
    from forge.cli import main as forge_main

    sys.exit(forge_main(["run", *sys.argv[1:]]))
