"""Supervised fine-tuning batches: data-source items tokenized into a ``TrainBatch`` whose
loss is the NLL of the response tokens (REINFORCE with advantage 1).

Two item shapes:

* ``{"prompt": str | chat messages, "target": str}``: the prompt's tokens exactly as the
  generator encodes them (``forge.generation.prompts.encode_prompt``: chat messages through
  the chat template with the generation prompt), the target then EOS as the response.
* ``{"messages": [...]}``: a multi-turn chat transcript (system/user/assistant/tool
  messages), laid out exactly as ``forge.envs.run_episode`` lays out an episode; only the
  assistant turns after the first user message are learned. With a history window
  (``window``, the RL run's ``env.history``) each assistant turn is its own row, prompted
  with its window, as the episode runner prompts it.
"""

from __future__ import annotations

from forge.envs.conversation import conversation_rows, conversation_tokens
from forge.envs.window import HistoryWindow
from forge.generation.prompts import encode_prompt
from forge.replay import collate_episodes
from forge.types import Episode, TrainBatch

__all__ = ["sft_batch"]


def sft_batch(tokenizer, items: list[dict], window: HistoryWindow | None = None) -> TrainBatch:
    """One SFT batch from ``items`` (see the module docstring)."""
    eos = tokenizer.eos_token_id
    episodes = []
    for i, it in enumerate(items):
        mask, starts = None, None
        if "messages" in it and window is not None:
            ids, full_mask, p, starts = conversation_rows(tokenizer, it["messages"], window)
            prompt_ids, response_ids, mask = ids[:p], ids[p:], full_mask[p:]
            starts = [s - p for s in starts] or None
        elif "messages" in it:
            ids, full_mask, p = conversation_tokens(tokenizer, it["messages"])
            prompt_ids, response_ids, mask = ids[:p], ids[p:], full_mask[p:]
        else:
            _, prompt_ids = encode_prompt(tokenizer, it["prompt"])
            response_ids = tokenizer(str(it["target"]), add_special_tokens=False)["input_ids"]
            response_ids = response_ids + [eos]
        episodes.append(
            Episode(
                f"sft-{i}",
                prompt_ids,
                response_ids,
                [0.0] * len(response_ids),
                reward=0.0,
                policy_version=0,
                advantage=1.0,
                loss_mask=mask,
                row_starts=starts,
            )
        )
    return collate_episodes(episodes, pad_id=tokenizer.pad_token_id or 0)
