"""Format rewards: a ``<think>...</think>`` structure, and a penalty for overlong responses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["LengthPenalty", "ThinkingReward", "length_penalty"]


class ThinkingReward:
    """Rewards ``<think>reasoning</think>answer``. Scale:

    - ``1.0``: well formed. The response (leading whitespace aside) starts with the opening
      tag, holds exactly one opening and one closing tag in that order, and both the
      reasoning and the answer after the closing tag are non-blank.
    - ``partial`` (default 0.5): exactly one tag of each kind, in order, but the reasoning or
      the answer is blank, or text precedes the opening tag.
    - ``0.0``: a tag missing, repeated, or closing before opening.

    ``prompt_opens_think=True`` is for chat templates that already end the prompt with the
    opening tag: the response must then contain no opening tag and exactly one closing tag,
    and the reasoning is the text before it.
    """

    def __init__(
        self,
        open_tag: str = "<think>",
        close_tag: str = "</think>",
        prompt_opens_think: bool = False,
        partial: float = 0.5,
        name: str = "thinking_format",
    ) -> None:
        self.open_tag, self.close_tag = open_tag, close_tag
        self.prompt_opens_think = prompt_opens_think
        self.partial = partial
        self.name = name

    def __call__(self, prompt: str, response: str, target: Any = None) -> float:
        n_open, n_close = response.count(self.open_tag), response.count(self.close_tag)
        if n_close != 1 or n_open != (0 if self.prompt_opens_think else 1):
            return 0.0
        before_close, answer = response.split(self.close_tag)
        if self.prompt_opens_think:
            preamble, reasoning = "", before_close
        else:
            if self.open_tag not in before_close:
                return 0.0  # closing tag first
            preamble, reasoning = before_close.split(self.open_tag)
        if preamble.strip() or not reasoning.strip() or not answer.strip():
            return self.partial
        return 1.0


def length_penalty(
    length: int, soft_limit: int, hard_limit: int, max_penalty: float = 1.0
) -> float:
    """0 up to ``soft_limit``, then falling linearly to ``-max_penalty`` at ``hard_limit``,
    and ``-max_penalty`` beyond (DAPO's "soft overlong punishment").

    E.g. ``soft_limit=100, hard_limit=200``: length 150 gives ``-0.5 * max_penalty``.
    """
    if not 0 <= soft_limit < hard_limit:
        raise ValueError(
            f"need 0 <= soft_limit < hard_limit, got soft_limit={soft_limit}, "
            f"hard_limit={hard_limit}"
        )
    if length <= soft_limit:
        return 0.0
    frac = min(1.0, (length - soft_limit) / (hard_limit - soft_limit))
    return -max_penalty * frac


class LengthPenalty:
    """Reward function form of ``length_penalty``, on ``count(response)``.

    ``count`` defaults to the number of characters; pass e.g.
    ``lambda s: len(tokenizer.encode(s))`` to count tokens.
    """

    def __init__(
        self,
        soft_limit: int,
        hard_limit: int,
        max_penalty: float = 1.0,
        count: Callable[[str], int] = len,
        name: str = "length_penalty",
    ) -> None:
        length_penalty(0, soft_limit, hard_limit)  # validate the limits now, not per call
        self.soft_limit, self.hard_limit = soft_limit, hard_limit
        self.max_penalty = max_penalty
        self.count = count
        self.name = name

    def __call__(self, prompt: str, response: str, target: Any = None) -> float:
        return length_penalty(
            self.count(response), self.soft_limit, self.hard_limit, self.max_penalty
        )
