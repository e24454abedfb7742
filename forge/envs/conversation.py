"""Whole conversations as training tokens, laid out exactly as ``run_episode`` lays them out.

SFT on multi-turn data must see the same token ids the policy will see and sample during RL,
or the two stages disagree about where a turn starts and ends. ``conversation_tokens``
renders a chat transcript with the same ``ChatRenderer`` arithmetic as the episode runner:

    [prompt: template(first messages) + generation prompt]     mask 0
    [assistant content ids + end-of-turn token]                 mask 1   (what the model samples)
    [close + next messages + generation prompt]                 mask 0
    ...

With a history window (``forge.envs.window``) ``conversation_rows`` lays a transcript out as
``run_episode`` does then: one row per assistant turn, its prompt rendered from the window.
"""

from __future__ import annotations

from forge.envs.chat import ChatRenderer
from forge.envs.messages import Message
from forge.envs.window import HistoryWindow, window_messages

__all__ = ["conversation_rows", "conversation_tokens"]


def conversation_tokens(tokenizer, messages: list[Message]) -> tuple[list[int], list[int], int]:
    """``(token_ids, loss_mask, prompt_length)`` of a transcript whose assistant messages are
    the targets. The transcript starts with at least one non-assistant message."""
    chat = ChatRenderer(tokenizer)
    first = _assistant_turns(messages)[0]
    end_of_turn = _end_of_turn_id(tokenizer)
    ids = chat.prompt_ids(messages[:first])
    prompt_length = len(ids)
    mask = [0] * len(ids)
    i = first
    while i < len(messages):
        sampled = chat.encode(messages[i]["content"]) + [end_of_turn]
        ids += sampled
        mask += [1] * len(sampled)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j == len(messages) and j == i + 1:
            break  # the conversation ends on this assistant turn
        context = chat.close_ids(sampled) + chat.suffix_ids(messages[: i + 1], messages[i + 1 : j])
        if j == len(messages):  # trailing observations: no turn of the model follows
            break
        ids += context
        mask += [0] * len(context)
        i = j
    return ids, mask, prompt_length


def conversation_rows(
    tokenizer, messages: list[Message], window: HistoryWindow
) -> tuple[list[int], list[int], int, list[int]]:
    """``(token_ids, loss_mask, prompt_length, row_starts)`` of a transcript under a history
    window: each assistant turn's row is the template of its window plus the turn's content
    and end-of-turn token (mask 1); ``row_starts`` are where the rows after the first begin."""
    chat = ChatRenderer(tokenizer)
    said = _assistant_turns(messages)
    end_of_turn = _end_of_turn_id(tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    starts: list[int] = []
    prompt_length = 0
    for k, i in enumerate(said):
        prompt = chat.prompt_ids(window_messages(messages[:i], window))
        if k:
            starts.append(len(ids))
        else:
            prompt_length = len(prompt)
        sampled = chat.encode(messages[i]["content"]) + [end_of_turn]
        ids += prompt + sampled
        mask += [0] * len(prompt) + [1] * len(sampled)
    return ids, mask, prompt_length, starts


def _assistant_turns(messages: list[Message]) -> list[int]:
    """Indices of the assistant messages; the transcript must open with another role."""
    said = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not said or said[0] == 0:
        raise ValueError(
            "a training conversation needs an opening message (user/system) and at least one "
            f"assistant message, got roles {[m['role'] for m in messages]}"
        )
    return said


def _end_of_turn_id(tokenizer) -> int:
    """The token the model samples to end its turn: ChatML's ``<|im_end|>`` if the vocabulary
    has it, else EOS."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id and im_end is not None:
        return im_end
    return tokenizer.eos_token_id
