"""History windows: each turn of a multi-turn episode prompted with the recent game only.

By default a turn's prompt is the whole conversation so far (one token sequence per episode).
With a window (``env.history``) each turn is prompted afresh with

    [system messages] [the task: the opening messages, if keep_task]
    [the model's last ``turns`` turns, each with the answer it got]   (the current observation
                                                                       is the last answer)

and becomes its own training row (its prompt, then the tokens it sampled), as verl-agent's
``history_length`` does. Prompts stay short however long the episode runs, and the current
state sits in the same place in every prompt; on the subtraction game the whole-game prompt
is what kept a small model on a pile-blind plateau (docs/benchmarks.md, "Credit over turns").

``turns: 0`` shows only the current observation (after the system messages, and the task
when ``keep_task``); a window that reaches back to the first turn is the whole conversation.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge.envs.messages import Message

__all__ = ["HistoryWindow", "window_messages"]


@dataclass(frozen=True)
class HistoryWindow:
    """How much of the game each turn's prompt shows (see the module docstring)."""

    turns: int = 0
    """The model's earlier turns kept, with the answers they got (0: only the current
    observation)."""
    keep_task: bool = True
    """Keep the opening (non-system) messages, the task, in every prompt (``false`` for
    environments whose observations say all there is to know)."""

    def __post_init__(self) -> None:
        if isinstance(self.turns, bool) or not isinstance(self.turns, int) or self.turns < 0:
            raise ValueError(f"history.turns must be an int >= 0, got {self.turns!r}")


def window_messages(messages: list[Message], window: HistoryWindow) -> list[Message]:
    """The prompt of the model's next turn after ``messages`` (a transcript that starts with
    at least one non-assistant message and does not end with an assistant one)."""
    said = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if len(said) <= window.turns:
        return list(messages)
    opening = messages[: said[0]]
    head = opening if window.keep_task else [m for m in opening if m.get("role") == "system"]
    start = said[-window.turns] if window.turns else said[-1] + 1
    return [*head, *messages[start:]]
