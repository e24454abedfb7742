"""Prompt sources for RL apps, served by a DatasetActor so rollout tasks share one stream.

``DataConfig.task`` picks the source: ``sumdigits`` (generated here), ``jsonl`` (a local file
of ``{"prompt"|question: ..., "target"|answer: ...}`` lines) or ``hf`` (a Hugging Face
dataset by hub id or local path; needs ``pip install datasets``). Each yields dicts with
``prompt`` and ``target`` and has a held-out list for evaluation.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from apps.sumdigits.task import SumDigits, sumdigits_reward
from controller import Actor, endpoint
from forge.rewards import ExactMatch, MathReward, ThinkingReward

TASKS = ("sumdigits", "jsonl", "hf")
REWARDS = {
    "sumdigits": sumdigits_reward,
    "exact_match": ExactMatch(),
    "math": MathReward(),
    "thinking": ThinkingReward(),
}


@dataclass
class DataConfig:
    task: str = "sumdigits"
    path: str = ""  # jsonl file, or HF dataset id / directory
    name: str = ""  # HF dataset config name (e.g. "main" for openai/gsm8k)
    split: str = "train"
    heldout_split: str = "test"
    prompt_field: str = "question"
    target_field: str = "answer"
    digits_min: int = 3
    digits_max: int = 4
    heldout_size: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown data.task {self.task!r}; choose one of {TASKS}")
        if self.task != "sumdigits" and not self.path:
            raise ValueError(f"data.task={self.task!r} needs data.path")


def build_rewards(names: list[str]) -> list:
    unknown = [n for n in names if n not in REWARDS]
    if unknown or not names:
        raise ValueError(f"unknown rewards {unknown or names}; choose from {sorted(REWARDS)}")
    return [REWARDS[n] for n in names]


class _Records:
    """A shuffled, repeating pass over a list of records (jsonl or HF)."""

    def __init__(self, train: list[dict], heldout: list[dict], seed: int):
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
        self._rng.setstate(state["rng"])
        self._order = list(state["order"])


def _normalise(rows, cfg: DataConfig) -> list[dict]:
    out = []
    for r in rows:
        prompt = r.get("prompt", r.get(cfg.prompt_field))
        target = r.get("target", r.get(cfg.target_field))
        if prompt is None or target is None:
            raise ValueError(
                f"{cfg.path}: a record lacks '{cfg.prompt_field}'/'{cfg.target_field}' "
                f"(or prompt/target): keys {sorted(r)}"
            )
        if cfg.target_field == "answer" and isinstance(target, str) and "####" in target:
            target = target.split("####")[-1].strip()  # GSM8K's final-answer convention
        out.append({"prompt": prompt, "target": target})
    return out


def build_source(cfg: DataConfig):
    if cfg.task == "sumdigits":
        return SumDigits(cfg.digits_min, cfg.digits_max, cfg.seed, cfg.heldout_size)
    if cfg.task == "jsonl":
        with open(cfg.path) as f:
            rows = _normalise([json.loads(line) for line in f if line.strip()], cfg)
        return _Records(rows[cfg.heldout_size :], rows[: cfg.heldout_size], cfg.seed)
    try:
        import datasets
    except ImportError as e:
        raise ImportError("data.task='hf' needs the datasets package: pip install datasets") from e
    name = cfg.name or None
    train = _normalise(datasets.load_dataset(cfg.path, name, split=cfg.split), cfg)
    held = _normalise(datasets.load_dataset(cfg.path, name, split=cfg.heldout_split), cfg)
    return _Records(train, held[: cfg.heldout_size], cfg.seed)


class DatasetActor(Actor):
    """Serves prompts: ``sample()``, ``heldout()``, ``state_dict()``/``load_state_dict()``."""

    def __init__(self, cfg: DataConfig):
        self.source = build_source(cfg)

    @endpoint
    async def sample(self) -> dict:
        return self.source.sample()

    @endpoint
    async def heldout(self) -> list[dict]:
        return self.source.heldout()

    @endpoint
    async def state_dict(self) -> dict:
        return self.source.state_dict()

    @endpoint
    async def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state)
