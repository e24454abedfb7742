"""The names of a run's step metrics: one place, read by the loop that logs them and by
``forge top`` (``forge.observability.status``), so renaming one renames it everywhere.

    log.step(version, {M.TRAIN_S: t2 - t1, M.STEP_S: t3 - t0, ...})

Keys an app invents for itself are fine (any ``"group/name"`` string); only the names below
have a fixed meaning that other parts of Forge read.
"""

from __future__ import annotations

__all__ = ["M"]


class M:
    """Step-metric names with a meaning Forge relies on (``forge top``'s rows among them)."""

    # rollouts (means over the step's groups)
    REWARD = "rollout/reward"  # the scalar reward; ``rollout/reward/<component>`` per component
    ZERO_VARIANCE_GROUPS = "rollout/zero_variance_groups"
    CARRIED_OVER_GROUPS = "rollout/carried_over_groups"
    TRUNCATED = "rollout/truncated"  # completions that ended at max_tokens (finish "length")
    # on-policy distillation (forge.rollout.distiller)
    TEACHER_KL = "rollout/teacher_kl"  # log p_student - log p_teacher, per sampled token
    TEACHER_ENTROPY = "rollout/teacher_entropy"  # the teacher's entropy at sampled tokens
    DISTILL_SHARE = "rollout/distill_share"  # |distillation advantage| / |whole advantage|
    DISTILLED_FRACTION = "rollout/distilled_fraction"  # tokens before teacher.stop_at_logprob
    TURNS = "env/turns"
    STEP_GROUPED_TURNS = "credit/step_grouped_turns"  # share of turns in step-level groups
    RETRIED_EPISODES = "env/retried_episodes"
    DROPPED_EPISODES = "env/dropped_episodes"
    DROPPED_GROUPS = "env/dropped_groups"
    PHASE = "phase/index"
    # the training step (``train/<key>`` for every metric the trainer returns)
    LOSS = "train/loss"
    SFT_LOSS = "sft/loss"
    SFT_LR = "sft/lr"
    TOKENS_PER_S = "train/tokens_per_s"
    # where the step's time went
    WAIT_BATCH_S = "time/wait_batch_s"
    TRAIN_S = "time/train_s"
    WEIGHT_SYNC_S = "time/weight_sync_s"
    STEP_S = "time/step_s"
    ELAPSED_S = "time/elapsed_s"
    # the replay buffer (reported by the buffer actor under ``replay/``)
    BUFFER_SIZE = "replay/size"
    SAMPLED_POLICY_AGE_MEAN = "replay/sampled_policy_age_mean"
    SAMPLED_POLICY_AGE_MAX = "replay/sampled_policy_age_max"
    EVICTED_STALE = "replay/evicted_stale"  # per flush
    # the buffer's running totals, as the loop logs them each step
    POLICY_AGE_MEAN = "buffer/sampled_policy_age_mean"
    EVICTED_STALE_TOTAL = "buffer/evicted_stale"
    # evaluation
    HELDOUT_ACCURACY = "eval/heldout_accuracy"
    MEAN_TURNS = "eval/mean_turns"
    # suffix of the per-process busy fractions (``<role>/busy_fraction``)
    BUSY_SUFFIX = "/busy_fraction"

    @staticmethod
    def train(key: str) -> str:
        """The step-row name of a metric the trainer returned (``loss`` -> ``train/loss``)."""
        return f"train/{key}"

    @staticmethod
    def advantage_std(turn: int) -> str:
        """The spread (std) of the advantages given to turn ``turn`` (0-based) in a group."""
        return f"credit/advantage_std/turn{turn}"

    @staticmethod
    def reward(component: str) -> str:
        """The step-row name of a named reward component's mean."""
        return f"{M.REWARD}/{component}"
