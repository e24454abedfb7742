"""Built-in data sources and the protocol every data source follows.

A data source is built inside the process that serves it (``forge.actors.DatasetActor``), so
heavy loading happens once, off the controller. It must have ``sample() -> dict`` (an item
with ``"prompt"`` and ``"target"``, or whatever the reward functions and environments of the
run expect) and ``heldout() -> list[dict]``; ``state_dict()`` / ``load_state_dict(state)``
make ``--resume`` continue the same stream (optional).
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Protocol, runtime_checkable

__all__ = ["DataSource", "HFSource", "JsonlSource", "RecordSource"]


@runtime_checkable
class DataSource(Protocol):
    """What a data source provides (``state_dict``/``load_state_dict`` are optional)."""

    def sample(self) -> dict[str, Any]: ...

    def heldout(self) -> list[dict[str, Any]]: ...


class RecordSource:
    """A shuffled, repeating pass over a list of records, plus a held-out list."""

    def __init__(self, train: list[dict], heldout: list[dict], seed: int = 0):
        if not train:
            raise ValueError("a data source needs at least one training record, got none")
        self.records, self._heldout = train, heldout
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def sample(self) -> dict:
        if not self._order:
            self._order = list(range(len(self.records)))
            self._rng.shuffle(self._order)
        return self.records[self._order.pop()]

    def heldout(self) -> list[dict]:
        return list(self._heldout)

    def state_dict(self) -> dict:
        return {"rng": self._rng.getstate(), "order": list(self._order)}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        self._order = list(state["order"])


def normalise_records(
    rows, source: str, prompt_field: str = "question", target_field: str = "answer"
) -> list[dict]:
    """``{"prompt", "target"}`` dicts from rows holding ``prompt``/``target`` or the named
    fields. A row without a target gets ``target: None`` (an environment or a reward that
    needs none judges it); a ``{"messages": [...]}`` row (a chat transcript for SFT) is kept
    as it is. GSM8K's ``#### <answer>`` convention is reduced to the final answer."""
    out = []
    for r in rows:
        if "messages" in r:
            out.append(dict(r))
            continue
        prompt = r.get("prompt", r.get(prompt_field))
        target = r.get("target", r.get(target_field))
        if prompt is None:
            raise ValueError(
                f"{source}: a record has neither '{prompt_field}' nor 'prompt' (nor "
                f"'messages'): keys {sorted(r)}; name its prompt field with prompt_field=..."
            )
        if target_field == "answer" and isinstance(target, str) and "####" in target:
            target = target.split("####")[-1].strip()
        out.append({**r, "prompt": prompt, "target": target})
    return out


def split_records(
    rows: list[dict], source: str, split_field: str, heldout_split: str, heldout_size: int
) -> tuple[list[dict], list[dict]]:
    """``(train, held-out)``: with a ``split_field`` in the rows, the rows whose split is
    ``heldout_split`` are held out (the first ``heldout_size`` of them) and the rows without
    that split train; without one, the first ``heldout_size`` rows are held out."""
    if not any(split_field in r for r in rows):
        return rows[heldout_size:], rows[:heldout_size]
    held = [r for r in rows if r.get(split_field) == heldout_split]
    train = [r for r in rows if r.get(split_field) != heldout_split]
    if not held:
        seen = sorted({str(r.get(split_field)) for r in rows})
        raise ValueError(
            f"{source}: no row has {split_field}={heldout_split!r} (splits: {seen}); set "
            "heldout_split=... to the split to hold out"
        )
    return train, held[:heldout_size]


class JsonlSource(RecordSource):
    """Records from a JSONL file. Held out: the rows whose ``split_field`` ("split") is
    ``heldout_split`` ("test") when the rows have that field, else the first
    ``heldout_size`` lines. A path that is not on this host (an actor on another host than
    the controller's) is read from the controller's host (``controller.files.stage_sync``)."""

    def __init__(
        self,
        path: str,
        prompt_field: str = "question",
        target_field: str = "answer",
        heldout_size: int = 200,
        seed: int = 0,
        split_field: str = "split",
        heldout_split: str = "test",
    ):
        from controller import files

        try:
            with open(files.stage_sync(os.path.abspath(path))) as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            raise FileNotFoundError(f"JsonlSource: no such file {path!r}") from None
        rows = normalise_records(rows, path, prompt_field, target_field)
        train, held = split_records(rows, path, split_field, heldout_split, heldout_size)
        super().__init__(train, held, seed)


class HFSource(RecordSource):
    """A Hugging Face dataset (hub id or local directory); needs ``pip install datasets``."""

    def __init__(
        self,
        path: str,
        name: str = "",
        split: str = "train",
        heldout_split: str = "test",
        prompt_field: str = "question",
        target_field: str = "answer",
        heldout_size: int = 200,
        seed: int = 0,
    ):
        try:
            import datasets
        except ImportError as e:
            raise ImportError("HFSource needs the datasets package: pip install datasets") from e
        train = datasets.load_dataset(path, name or None, split=split)
        held = datasets.load_dataset(path, name or None, split=heldout_split)
        super().__init__(
            normalise_records(train, path, prompt_field, target_field),
            normalise_records(held, path, prompt_field, target_field)[:heldout_size],
            seed,
        )
