"""``ExactMatch``: the response's answer, as text, equals ``str(target)``."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ExactMatch"]


class ExactMatch:
    """``(prompt, response, target) -> 1.0 | 0.0`` by string equality after stripping whitespace.

    Without ``pattern`` the whole response is the answer. With ``pattern`` (a regex) the
    answer is its *last* match in the response: group 1 if the pattern has a group, else the
    whole match; no match scores 0. ``ignore_case`` compares case-insensitively.
    Example: ``ExactMatch(r"####\\s*(.+)")`` for GSM8K-style answers.
    """

    def __init__(
        self, pattern: str | None = None, ignore_case: bool = False, name: str = "exact_match"
    ) -> None:
        self.name = name
        self.ignore_case = ignore_case
        self._regex = re.compile(pattern) if pattern is not None else None

    def extract(self, response: str) -> str | None:
        """The answer text ``__call__`` compares, or None when ``pattern`` does not match."""
        if self._regex is None:
            return response.strip()
        matches = list(self._regex.finditer(response))
        if not matches:
            return None
        last = matches[-1]
        return (last.group(1) if self._regex.groups else last.group(0)).strip()

    def __call__(self, prompt: str, response: str, target: Any) -> float:
        if target is None:
            raise ValueError(
                "exact_match: the item has no target to compare with; give the data a target "
                "field (data kwargs target_field=...) or use a reward that needs none"
            )
        answer, expected = self.extract(response), str(target).strip()
        if answer is None:
            return 0.0
        if self.ignore_case:
            answer, expected = answer.casefold(), expected.casefold()
        return 1.0 if answer == expected else 0.0
