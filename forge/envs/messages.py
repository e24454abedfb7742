"""Messages of multi-turn environments: what an environment returns, what an episode produces.

``Message`` is a chat message dict (``{"role": ..., "content": ...}``, plus ``name`` for tool
results). ``StepResult`` is an environment's answer to one model turn. ``Trajectory`` is one
whole episode as the trainer sees it: the token ids of the conversation, a loss mask that is
1 exactly on the tokens the policy sampled, and the behaviour logprobs of those tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FINISH_REASONS",
    "EnvContractError",
    "Message",
    "StepResult",
    "Trajectory",
    "as_observation",
    "as_step_result",
    "to_messages",
]

Message = dict[str, Any]

# Why an episode ended:
# - "done": the environment said so (StepResult.done);
# - "max_turns": the model had its max_turns turns;
# - "max_context": the next prompt (or a turn cut short to fit) reached max_context_tokens;
# - "env_error": reset/step raised or ran past step_timeout_s;
# - "length": a turn hit max_tokens and the runner was asked to stop on that (end_on_length).
FINISH_REASONS = ("done", "max_turns", "max_context", "env_error", "length")


@dataclass
class StepResult:
    """An environment's answer to one model turn.

    ``observation`` is what the model sees next: chat messages, one message, a string (sent
    as a ``user`` message) or ``None`` (nothing new; the model speaks again). ``reward`` is a
    number or named components (``{"correct": 1.0, "format": 0.5}``). ``info`` is free-form
    and kept for logging, except ``info["state"]``: a hashable key of the state the next
    turn is taken in, for credit assignment over turns (``rollout.credit: gigpo`` groups
    turns taken in equal states). Without it the key is the observation's text; give one
    when the observation alone does not identify the state (e.g. "higher" after a guess).
    """

    observation: list[Message] | Message | str | None = None
    reward: float | dict[str, float] = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class EnvContractError(TypeError):
    """An environment returned something of the wrong shape. Unlike a failing step (which
    ends only its episode), this is a bug that would fail every episode, so it stops the
    run."""


def as_step_result(result: Any, where: str = "env.step") -> StepResult:
    """``step``'s return value as a :class:`StepResult`.

    Besides a ``StepResult``, ``step`` may return the gym-style tuple ``(observation,
    reward, done, info)`` or gymnasium's ``(observation, reward, terminated, truncated,
    info)`` (``done`` is either flag; ``info["truncated"]`` keeps the second). Anything else
    raises :class:`EnvContractError` naming ``where`` and what it returned.
    """
    if isinstance(result, StepResult):
        return result
    if isinstance(result, tuple) and len(result) in (4, 5):
        obs, reward, *flags, info = result
        ok_reward = isinstance(reward, (int, float, dict)) and not isinstance(reward, bool)
        if ok_reward and isinstance(info, (dict, type(None))):
            info = dict(info or {})
            if len(flags) == 2:
                info.setdefault("truncated", bool(flags[1]))
            return StepResult(obs, reward, bool(any(flags)), info)
    raise EnvContractError(
        f"{where} returned {type(result).__name__} {result!r:.120}; return "
        "StepResult(observation, reward, done, info) or the tuple (observation, reward, "
        "done, info) with a float (or dict of floats) reward and a dict info"
    )


def as_observation(result: Any, where: str = "env.reset") -> list[Message]:
    """``reset``'s return value (an observation, or gymnasium's ``(observation, info)``) or
    a ``StepResult``'s observation, as messages; :class:`EnvContractError` when it is
    neither a string, a message, a list of messages nor ``None``."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        result = result[0]  # gymnasium's reset: (observation, info)
    try:
        return to_messages(result)
    except TypeError as e:
        raise EnvContractError(f"{where} returned {result!r:.120}: {e}") from None


@dataclass
class Trajectory:
    """One multi-turn episode, token-aligned for training.

    ``token_ids`` is the whole conversation, initial prompt first, exactly as the generator
    saw and sampled it (sampled ids are never re-tokenised). ``loss_mask[i]`` is 1 when the
    policy sampled ``token_ids[i]`` and 0 for prompt, environment/tool and chat-template
    tokens; ``logprobs[i]`` is the behaviour logprob of a sampled token and 0.0 elsewhere.

    Per model turn ``k``: ``turn_spans[k] = (start, end)`` is where its sampled tokens lie in
    ``token_ids``, ``turn_versions[k]`` the policy version that sampled it and
    ``turn_rewards[k]`` the reward the environment gave for it (0.0 for a tool-call turn);
    ``turn_states[k]`` a key of the state it was taken in (what credit assignment over turns
    groups by: the environment's ``info["state"]`` from the step before, else the text of the
    observation the model answered; the first turn's is the initial observation's text).
    ``reward`` is the episode's scalar reward (by default the sum of the scalar turn rewards);
    ``reward_components`` sums named (dict) turn rewards by name. ``prompt_length`` is the
    number of tokens of the initial prompt. ``messages`` is the chat transcript (logging).

    ``row_starts`` (history windows, ``forge.envs.window``): where in ``token_ids`` each
    turn after the first begins its own row, its prompt rendered afresh from the window; the
    tokens of a row see only that row. Empty: one sequence.
    """

    task_id: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    turn_versions: list[int]
    turn_rewards: list[float | dict[str, float]]
    reward: float
    reward_components: dict[str, float]
    num_turns: int
    finish_reason: str
    truncated: bool = False
    messages: list[Message] = field(default_factory=list)
    target: Any = None
    prompt_length: int = 0
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    turn_states: list[Any] = field(default_factory=list)
    row_starts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"Trajectory {self.task_id!r}: token_ids ({n}), loss_mask "
                f"({len(self.loss_mask)}) and logprobs ({len(self.logprobs)}) must align"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"Trajectory finish_reason {self.finish_reason!r} is unknown; "
                f"choose one of {FINISH_REASONS}"
            )

    @property
    def oldest_version(self) -> int:
        """The oldest policy version that sampled a turn (-1 if no turn was sampled).

        The replay buffer ages a trajectory by this: its stalest tokens bound how off-policy
        it is."""
        return min(self.turn_versions, default=-1)

    @property
    def num_sampled_tokens(self) -> int:
        """How many tokens the policy sampled (the ones that count in the loss)."""
        return sum(self.loss_mask)


def to_messages(observation: Any, role: str = "user") -> list[Message]:
    """An observation (``StepResult.observation`` or ``reset``'s value) as chat messages.

    A string becomes one ``role`` message, a dict one message, ``None`` no message; a list is
    returned as a list. ``TypeError`` for anything else or a message without role/content.
    """
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": role, "content": observation}]
    messages = [observation] if isinstance(observation, dict) else observation
    if not isinstance(messages, list):
        raise TypeError(
            "an observation must be a string, a chat message dict, a list of them or None, "
            f"got {type(observation).__name__}"
        )
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise TypeError(
                f"observation message {m!r} is not a chat message; use "
                '{"role": "user", "content": "..."}'
            )
    return list(messages)
