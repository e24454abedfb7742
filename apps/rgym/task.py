"""The SFT data of the reasoning-gym demo: the dataset's own questions and answers.

The RL stage reads the dataset through Forge's adapter (``data: {fn: reasoning_gym}``),
whose items carry reasoning-gym's whole entry as the target, for the reward to score. SFT
needs the answer as text to imitate instead; this source is the adapter with that target.
"""

from __future__ import annotations

from forge import ReasoningGymSource

__all__ = ["Answers"]


class Answers(ReasoningGymSource):
    """``ReasoningGymSource`` items with the entry's ``answer`` as the target text (what
    ``forge.data.sft_batch`` trains on); the held-out list is the same as the adapter's."""

    def sample(self) -> dict:
        item = super().sample()
        return {**item, "target": item["target"]["answer"]}
