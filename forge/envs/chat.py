"""Chat-template token arithmetic for token-in/token-out multi-turn rollouts.

A multi-turn episode's token ids are built by appending, never by re-rendering the whole
conversation: the model's sampled ids go in verbatim (re-tokenising its text can give other
ids, and the trainer would then score tokens the policy never sampled). What the template
adds around them is computed here:

- :meth:`ChatRenderer.prompt_ids`: the initial prompt (template + generation prompt).
- :meth:`ChatRenderer.close_ids`: the template tokens that end an assistant message after
  what the model sampled. For ChatML the model samples ``<|im_end|>`` and the template adds
  ``\\n``; a turn cut by ``max_tokens`` gets ``<|im_end|>\\n``.
- :meth:`ChatRenderer.suffix_ids`: the tokens of new messages plus the next generation
  prompt, as the difference between rendering the conversation with and without them. That
  difference must be a pure suffix; for templates where it is not (some rewrite earlier
  turns depending on later ones) it falls back to the same difference over a small fixed
  conversation, then to rendering the new messages alone.
"""

from __future__ import annotations

from typing import Any

from forge.envs.messages import Message

__all__ = ["ChatRenderer", "longest_overlap"]

_PLACEHOLDER = "\x00forge-placeholder\x00"
_DUMMY_BASE: list[Message] = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
]


def longest_overlap(ids: list[int], close: list[int]) -> int:
    """Largest ``k`` such that ``ids`` ends with ``close[:k]`` (0 if none).

    >>> longest_overlap([5, 6, 3], [3, 10])
    1
    >>> longest_overlap([5, 6], [3, 10])
    0
    """
    for k in range(min(len(ids), len(close)), 0, -1):
        if ids[len(ids) - k :] == close[:k]:
            return k
    return 0


class ChatRenderer:
    """Renders chat messages to token ids with ``tokenizer``'s chat template.

    ``template_kwargs`` go to every ``apply_chat_template`` call (e.g. ``tools=...``), so
    every rendering of one episode agrees. Text is tokenised without adding special tokens
    (the template holds any BOS).
    """

    def __init__(self, tokenizer, template_kwargs: dict[str, Any] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template; multi-turn episodes need one "
                "(set tokenizer.chat_template)"
            )
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.fallbacks = 0  # how often suffix_ids could not use the conversation itself
        self._close: list[int] | None = None

    def render_text(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render_ids(self, messages: list[Message], add_generation_prompt: bool) -> list[int]:
        return self.encode(self.render_text(messages, add_generation_prompt))

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The ids of ``messages`` followed by the assistant generation prompt."""
        return self.render_ids(messages, add_generation_prompt=True)

    def close_ids(self, sampled_ids: list[int]) -> list[int]:
        """Template tokens to append after a turn's ``sampled_ids`` to close the message.

        The closing is what the template writes after an assistant message's content; the
        part the model already sampled (its end-of-turn token) is not repeated.
        """
        if self._close is None:
            closing = [_DUMMY_BASE[0], {"role": "assistant", "content": _PLACEHOLDER}]
            text = self.render_text(closing, add_generation_prompt=False)
            if _PLACEHOLDER not in text:
                raise ValueError("the chat template drops assistant message content")
            self._close = self.encode(text[text.rindex(_PLACEHOLDER) + len(_PLACEHOLDER) :])
        return self._close[longest_overlap(sampled_ids, self._close) :]

    def suffix_ids(self, history: list[Message], new: list[Message]) -> list[int]:
        """Ids of ``new`` messages plus the generation prompt, to append after ``history``
        (which ends with the closed assistant turn); see the module docstring."""
        for base in (history, _DUMMY_BASE):
            before = self.render_ids(base, add_generation_prompt=False)
            after = self.render_ids([*base, *new], add_generation_prompt=True)
            if after[: len(before)] == before:
                return after[len(before) :]
            self.fallbacks += 1
        return self.prompt_ids(new)
