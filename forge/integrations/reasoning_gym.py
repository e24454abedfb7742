"""reasoning-gym's procedural datasets as a data source, and their own scoring as the reward.

    data: {fn: reasoning_gym, kwargs: {name: chain_sum, min_terms: 2, max_terms: 3}}
    rewards: [{fn: reasoning_gym, kwargs: {name: chain_sum, min_terms: 2, max_terms: 3}}]

- ``ReasoningGymSource(name, **config)``: ``reasoning_gym.create_dataset(name, **config)``
  generated once (in the process that serves the data), shuffled and repeated; a held-out
  list drawn from its own seed, with every held-out question removed from training.
- ``ReasoningGymReward(name, **config)``: the dataset class's own ``score_answer(answer,
  entry)``, the answer being the last ``<answer>...</answer>`` of the response
  (reasoning-gym's ``extract_answer``), or the whole response when it has no tags.

Needs ``pip install reasoning-gym`` (or ``pip install 'forge[envs]'``); it is imported only
when one of these is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import Any

from forge.data.sources import RecordSource

__all__ = ["ReasoningGymReward", "ReasoningGymSource", "make_dataset"]


def _registry() -> dict[str, tuple[type, type]]:
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        raise ImportError(
            "the reasoning_gym adapter needs the reasoning-gym package: pip install "
            "reasoning-gym (or pip install 'forge[envs]')"
        ) from e
    return DATASETS


def _dataset_config(name: str, config: dict[str, Any]) -> tuple[type, Any]:
    """``(dataset class, validated config object)`` of ``name``: ``ValueError`` for an unknown
    dataset (with close names), a key its config does not have (with the valid keys), or a
    value its ``validate`` rejects. ``composite`` takes ``datasets`` as mappings."""
    registry = _registry()
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"reasoning_gym has no dataset {name!r}{hint} (all {len(registry)}: "
            "python -c 'from reasoning_gym.factory import DATASETS; print(sorted(DATASETS))')"
        )
    dataset_cls, config_cls = registry[name]
    valid = [f.name for f in dataclasses.fields(config_cls)]
    unknown = sorted(set(config) - set(valid))
    if unknown:
        raise ValueError(
            f"reasoning_gym dataset {name!r} has no config key(s) {unknown}; its keys are {valid}"
        )
    try:
        if name == "composite" and config.get("datasets"):
            from reasoning_gym.composite import DatasetSpec

            specs = [
                d if isinstance(d, DatasetSpec) else DatasetSpec(**d) for d in config["datasets"]
            ]
            config = {**config, "datasets": specs}
        cfg = config_cls(**config)
        if callable(getattr(cfg, "validate", None)):
            cfg.validate()  # reasoning-gym validates by assert
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"reasoning_gym dataset {name!r} rejects config {config}: {e}") from None
    return dataset_cls, cfg


def make_dataset(name: str, **config: Any) -> Any:
    """What ``reasoning_gym.create_dataset(name, **config)`` makes, its errors made plain: an unknown
    name or key, or a value the config rejects, is a ``ValueError`` naming the dataset.
    ``composite`` takes ``datasets`` as ``{name, weight, config}`` mappings."""
    dataset_cls, cfg = _dataset_config(name, config)
    try:
        return dataset_cls(config=cfg)
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"reasoning_gym dataset {name!r} rejects config {config}: {e}") from None


def _prompt(question: str, system_prompt: str | None) -> str | list[dict[str, str]]:
    if system_prompt is None:
        return question
    from reasoning_gym.utils import SYSTEM_PROMPTS

    system = SYSTEM_PROMPTS.get(system_prompt, system_prompt)
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


class ReasoningGymSource(RecordSource):
    """A reasoning-gym dataset as a Forge data source (``sample()``, ``heldout()``,
    ``state_dict()`` / ``load_state_dict()`` so ``--resume`` continues the same stream).

    Items are ``{"prompt", "target", "task_id"}``: ``prompt`` is the question (a string, or
    chat messages when ``system_prompt`` is set); ``target`` is reasoning-gym's own entry
    (``question``, ``answer``, ``metadata``), what ``ReasoningGymReward`` scores against.

    Args:
        name: a registered reasoning-gym dataset (``chain_sum``, ``count_bits``, ...).
        size: training entries generated from ``seed``, minus any held-out question; they
            are served in a shuffled order (``seed`` too), reshuffled on each pass.
        seed: the training entries' seed (and the shuffle's).
        heldout_size: held-out entries, generated from ``heldout_seed`` (duplicate questions
            dropped). The default ``heldout_seed`` is the same for every training seed, so
            sources that differ only in ``seed`` (an SFT and an RL stage) share one held-out
            list and never train on it.
        system_prompt: ``None`` (the prompt is the question text), a key of
            ``reasoning_gym.utils.SYSTEM_PROMPTS`` (``default``, ``direct``, ...) or any
            text: the prompt is then ``[system, user]`` chat messages.
        **config: the dataset's config (``min_terms``, ``max_digits``, ...).

    An unknown ``name`` or config key is a ``ValueError`` listing close names / valid keys;
    ``check_config`` raises it when the run's config loads.
    """

    @classmethod
    def check_config(cls, name: str, **kwargs: Any) -> None:
        """The constructor's errors for a bad dataset name, config key or value, with nothing
        generated (``forge.plugins`` calls it when the config loads)."""
        own = inspect.signature(cls.__init__).parameters
        _dataset_config(name, {k: v for k, v in kwargs.items() if k not in own})

    def __init__(
        self,
        name: str,
        size: int = 1000,
        seed: int = 0,
        heldout_size: int = 100,
        heldout_seed: int = 10_000,
        system_prompt: str | None = None,
        **config: Any,
    ):
        if size < 1 or heldout_size < 0:
            raise ValueError(f"need size >= 1 and heldout_size >= 0, got {size}, {heldout_size}")
        self.name = name

        def item(entry: dict, task_id: str) -> dict:
            prompt = _prompt(entry["question"], system_prompt)
            return {"prompt": prompt, "target": dict(entry), "task_id": task_id}

        held: dict[str, dict] = {}
        if heldout_size:
            data = make_dataset(name, **config, size=heldout_size, seed=heldout_seed)
            for i, entry in enumerate(data):
                held.setdefault(entry["question"], item(entry, f"{name}-heldout-{i}"))
        data = make_dataset(name, **config, size=size, seed=seed)
        train = [
            item(entry, f"{name}-{seed}-{i}")
            for i, entry in enumerate(data)
            if entry["question"] not in held
        ]
        if not train:
            raise ValueError(
                f"reasoning_gym {name!r}: all {size} training entries are held-out questions; "
                "raise size, lower heldout_size or widen the config"
            )
        super().__init__(train, list(held.values()), seed)


class ReasoningGymReward:
    """``(prompt, response, target) -> float``: the dataset's own ``score_answer(answer,
    target)`` (``target``: the entry a ``ReasoningGymSource`` item carries).

    The answer is the last ``<answer>...</answer>`` in the response (reasoning-gym's
    ``extract_answer``), or the whole response, stripped, when it has no such tags.
    ``binary=True`` gives 1.0 only for full marks (``score_answer`` >= 1.0) and 0.0 for
    any partial credit: a success rate, e.g. as ``eval.reward``. The component is named
    after the dataset (``rollout/reward/chain_sum``).

    Args:
        name: the reasoning-gym dataset whose ``score_answer`` scores.
        binary: full marks or nothing (see above).
        **config: that dataset's config, the source's ``**config`` (some datasets score by it).
    """

    def __init__(self, name: str, binary: bool = False, **config: Any):
        self.name, self.binary, self._config = name, binary, config
        self._dataset = make_dataset(name, **self._config)  # a bad name fails at load

    def __getstate__(self) -> dict:
        # Rebuilt where it is used: a dataset object need not pickle.
        return {**self.__dict__, "_dataset": None}

    def extract(self, response: str) -> str:
        """The answer ``__call__`` scores: the last ``<answer>`` tag's text, else the response
        (both stripped), as reasoning-gym's ``extract_answer`` finds it."""
        answer = _last_answer_tag(response)
        return response.strip() if answer is None else answer

    def __call__(self, prompt: Any, response: str, target: Any) -> float:
        if not (isinstance(target, dict) and "answer" in target):
            raise TypeError(
                f"ReasoningGymReward({self.name!r}) needs the reasoning-gym entry as target "
                f"(a dict with 'answer' and 'metadata', as the reasoning_gym data source "
                f"gives), got {type(target).__name__} {target!r:.80}"
            )
        if self._dataset is None:
            self._dataset = make_dataset(self.name, **self._config)
        score = float(self._dataset.score_answer(self.extract(response), target))
        if self.binary:
            return 1.0 if score >= 1.0 else 0.0
        return score


def _last_answer_tag(text: str) -> str | None:
    """The stripped text of the last ``<answer>...</answer>`` (each opening tag paired with
    the first closing tag after it), or None: ``reasoning_gym.utils.extract_answer``'s answer.
    Read with ``str.find``: its lazy regex reads the rest of the text again from every
    unclosed opening tag."""
    last, pos = None, 0
    while (start := text.find("<answer>", pos)) >= 0:
        stop = text.find("</answer>", start + len("<answer>"))
        if stop < 0:
            break
        last, pos = (start + len("<answer>"), stop), stop + len("</answer>")
    return None if last is None else text[last[0] : last[1]].strip()
