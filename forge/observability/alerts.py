"""Signals that cannot learn, said out loud: a step whose every reward is 0.

GRPO-style advantages are zero when every reward of a group is equal, so a reward that never
fires (a format the policy does not produce, a target the reward cannot match) trains nothing
while the run looks healthy. ``RewardAlerts.check`` looks at one step's individual reward
values (``MetricLog`` holds them before it averages) and returns a warning that names the
reward components that never fired, or ``None``. While the condition lasts it repeats every
``every`` steps, and it says when the rewards come back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from forge.observability.names import M

__all__ = ["RewardAlerts", "TruncationAlerts"]


class RewardAlerts:
    """Tracks all-zero reward steps (see the module)."""

    def __init__(self, every: int = 10) -> None:
        self.every = every
        self.zero_since: int | None = None

    def check(
        self,
        step: int,
        values: Mapping[str, Sequence[float]],
        samples: Sequence[Mapping] = (),
    ) -> str | None:
        """``values``: the step's reward values by metric name (``rollout/reward`` and
        ``rollout/reward/<component>``); ``samples``: the step's episode records
        (``episode_log.episode_record``), two of which the warning shows with the prompt's
        first token ids, so a wrong template or a missing BOS is visible at once; returns
        the warning to show, if any."""
        total = values.get(M.REWARD)
        if not total:
            return None
        if any(v != 0 for v in total):
            if self.zero_since is None:
                return None
            since, self.zero_since = self.zero_since, None
            return f"rewards are non-zero again at step {step} (all 0 since step {since})"
        if self.zero_since is None:
            self.zero_since = step
        elif (step - self.zero_since) % self.every:
            return None
        prefix = M.REWARD + "/"
        dead = sorted(
            k[len(prefix) :] for k, v in values.items() if k.startswith(prefix) and v and not any(v)
        )
        which = f" (components never non-zero: {', '.join(dead)})" if dead else ""
        return (
            f"every reward was 0 at step {step} ({len(total)} episodes{which}, since step "
            f"{self.zero_since}): equal rewards give zero advantages, so nothing is learned. "
            "Check the reward on a few responses (`forge episodes <run_dir>`): does it parse "
            "the policy's answer format and the data's targets?" + _show(samples)
        )


def _show(samples: Sequence[Mapping], n: int = 2, chars: int = 120) -> str:
    """Two sampled responses and the first prompt's head (text and token ids)."""
    if not samples:
        return ""
    lines = []
    for r in samples[:n]:
        said = [m.get("content", "") for m in r.get("messages", []) if m.get("role") == "assistant"]
        lines.append(f"  response: {said[-1][:chars]!r}" if said else "  response: (none)")
    first = samples[0]
    asked = [
        m.get("content", "") for m in first.get("messages", []) if m.get("role") != "assistant"
    ]
    head = first.get("prompt_head_ids")
    if asked:
        lines.append(f"  prompt starts: {asked[0][:chars]!r}")
    if head is not None:
        lines.append(
            f"  prompt's first token ids: {head} (does it start with the model's BOS, as "
            "`forge models check MODEL` shows it?)"
        )
    return "\n" + "\n".join(lines)


class TruncationAlerts:
    """Steps where at least ``share`` of the completions ended at ``max_tokens``: an answer
    cut off before it ends (a base model writing on past its answer, an equation before the
    number) is scored as written, so the reward judges fragments. Warns at the first such
    step, every ``every`` steps while it lasts, and when it ends."""

    def __init__(self, share: float = 0.5, every: int = 10) -> None:
        self.share, self.every = share, every
        self.since: int | None = None

    def check(self, step: int, truncated: Sequence[float]) -> str | None:
        """``truncated``: the step's per-completion flags (``rollout/truncated``)."""
        if not truncated:
            return None
        frac = sum(truncated) / len(truncated)
        if frac < self.share:
            if self.since is None:
                return None
            since, self.since = self.since, None
            return f"completions end before max_tokens again at step {step} (since {since})"
        if self.since is None:
            self.since = step
        elif (step - self.since) % self.every:
            return None
        return (
            f"{frac:.0%} of step {step}'s completions ended at rollout.max_tokens (since step "
            f"{self.since}): the reward scores cut-off answers. Raise rollout.max_tokens (and "
            "eval.max_tokens), or end answers with a stop string (generator.sampling.stop); "
            "`forge episodes <run_dir>` shows them"
        )
