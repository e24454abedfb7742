"""What the policy does, written down: a sample of each step's episodes in
``<run_dir>/episodes.jsonl``, and ``forge episodes RUN_DIR`` to read them.

Each line is one episode::

    {"step": 12, "version": 11, "task_id": "...", "reward": 0.9, "advantage": 0.7,
     "components": {"success": 1.0, ...}, "turn_rewards": [...], "finish_reason": "done",
     "num_turns": 3, "messages": [{"role": "user", "content": ...}, ...], "target": ...}

``step`` is the training step the episode was logged with, ``version`` the (oldest) policy
version that sampled it. The run keeps ``log_episodes`` per step (whole groups, so a step
shows members of one prompt side by side); ``forge episodes RUN_DIR [--step N] [--best |
--worst] [-n K] [--disagree N]`` prints them as conversations.

An episode a distillation teacher scored also has ``"distill": {"response_ids": [...],
"student": [...], "teacher": [...]}`` (each response token's logprob under the generator and
the teacher); ``forge episodes`` then lists the tokens where the two disagree most
(``disagreements``), decoded with the run's tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge.observability.backends import read_jsonl

__all__ = [
    "EpisodeSamples",
    "disagreements",
    "episode_record",
    "read_episodes",
    "run_decoder",
    "show_episodes",
]

FILE = "episodes.jsonl"
PROMPT_HEAD = 8  # the prompt's first token ids kept per record: a missing BOS shows there


def episode_record(episode, messages: list[dict], num_turns: int = 1) -> dict[str, Any]:
    """The JSON record of a scored ``forge.types.Episode`` and its conversation."""
    target = episode.target
    try:
        json.dumps(target)
    except (TypeError, ValueError):
        target = repr(target)
    record = {
        "version": int(episode.policy_version),
        "task_id": episode.group_id,
        "reward": float(episode.reward),
        "advantage": float(episode.advantage),
        "components": {k: float(v) for k, v in episode.reward_breakdown.items()},
        "turn_rewards": _plain(episode.turn_rewards) if episode.turn_rewards else None,
        "finish_reason": episode.stop_reason,
        "num_turns": num_turns,
        "messages": [{"role": m.get("role"), "content": str(m.get("content"))} for m in messages],
        "target": target,
        "prompt_head_ids": [int(t) for t in episode.prompt_ids[:PROMPT_HEAD]],
    }
    teacher = getattr(episode, "teacher_logprobs", None)
    if teacher is not None:
        record["distill"] = {
            "response_ids": [int(t) for t in episode.response_ids],
            "student": [float(x) for x in episode.behavior_logprobs],
            "teacher": [float(x) for x in teacher],
        }
    return record


def disagreements(record: dict, n: int) -> list[tuple[int, int, float, float]]:
    """The ``n`` response tokens of ``record`` where the student's and the teacher's logprobs
    differ most in magnitude, largest first: ``(position, token id, student, teacher)``;
    ``[]`` for a record without teacher logprobs."""
    d = record.get("distill")
    if not d or n <= 0:
        return []
    rows = list(zip(range(len(d["teacher"])), d["response_ids"], d["student"], d["teacher"]))
    rows.sort(key=lambda r: abs(r[2] - r[3]), reverse=True)
    return rows[:n]


def run_decoder(run_dir: str | Path):
    """``decode(token_id) -> str`` with the tokenizer of the run's policy (from the
    ``config.yaml`` beside its episodes), or ``None`` when it cannot be loaded."""
    import yaml

    root = Path(run_dir)
    for path in (root / "config.yaml", root / "rl" / "config.yaml"):
        if path.is_file():
            model = (yaml.safe_load(path.read_text()) or {}).get("policy", {}).get("model")
            break
    else:
        return None
    try:
        from forge.models import load_tokenizer
        from forge.training.lora import tokenizer_source

        tok = load_tokenizer(tokenizer_source(model))
    except (OSError, ValueError, TypeError):
        return None
    return lambda token_id: tok.decode([token_id])


def _plain(values: list) -> list:
    return [
        {k: float(x) for k, x in v.items()} if isinstance(v, dict) else float(v) for v in values
    ]


class EpisodeSamples:
    """Episode records of the coming step, appended to ``<run_dir>/episodes.jsonl`` when the
    step is logged."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / FILE
        self._pending: list[dict] = []

    def room(self, per_step: int) -> int:
        """How many more records the step keeps when it keeps ``per_step``."""
        return max(0, per_step - len(self._pending))

    def add(self, records: list[dict]) -> None:
        self._pending += records

    def pending(self) -> list[dict]:
        """The records kept so far for the coming step."""
        return list(self._pending)

    def write(self, step: int) -> None:
        if not self._pending:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            for r in self._pending:
                f.write(json.dumps({"step": step, **r}) + "\n")
        self._pending = []


def read_episodes(run_dir: str | Path) -> list[dict]:
    """Every record of a run (``run_dir`` or its ``rl`` stage). ``FileNotFoundError`` that
    says where it looked."""
    root = Path(run_dir)
    for path in (root / FILE, root / "rl" / FILE, root):
        if path.is_file():
            return read_jsonl(path)
    raise FileNotFoundError(
        f"no {FILE} in {root} or {root / 'rl'}: is it a run directory of an RL run "
        "(rollout.log_episodes > 0)?"
    )


def select(records: list[dict], step: int | None, order: str | None, n: int) -> list[dict]:
    """The records to show: of ``step`` (default: the last step; every step with an
    ``order``), sorted by reward (``best``/``worst``), the first ``n``."""
    if not records:
        return []
    if step is None and order is None:
        step = records[-1]["step"]
    chosen = [r for r in records if step is None or r["step"] == step]
    if order is not None:
        chosen = sorted(chosen, key=lambda r: r["reward"], reverse=order == "best")
    return chosen[:n]


def show_episodes(records: list[dict], console=None, disagree: int = 0, decode=None) -> None:
    """Print episodes as conversations (rich): a header (step, version, reward, components,
    finish reason) and each message, with the turn's reward after an assistant message; with
    ``disagree``, under an episode with teacher logprobs, its ``disagree`` tokens of largest
    ``|student - teacher|`` (text by ``decode(token_id)``, else the id)."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    console = console or Console()
    style = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "magenta"}
    for r in records:
        body, turn = Text(), 0
        for m in r["messages"]:
            role = m["role"] or "?"
            body.append(f"{role}: ", style=f"bold {style.get(role, '')}")
            body.append(m["content"] + "\n", style=style.get(role, ""))
            if role == "assistant" and r.get("turn_rewards") and turn < len(r["turn_rewards"]):
                body.append(f"  ↳ turn reward {_fmt(r['turn_rewards'][turn])}\n", style="yellow")
                turn += 1
        comps = " ".join(f"{k}={v:.3g}" for k, v in r["components"].items())
        title = (
            f"step {r['step']} · v{r['version']} · reward {r['reward']:.3f} · "
            f"adv {r['advantage']:+.2f} · {r['finish_reason']} · {r['num_turns']} turn(s)"
        )
        target = f"target: {r['target']}" if r.get("target") is not None else ""
        console.print(
            Panel(body, title=title, subtitle=" · ".join(x for x in (comps, target) if x))
        )
        rows = disagreements(r, disagree)
        if rows:
            console.print(_disagreement_table(rows, decode))


def _disagreement_table(rows, decode):
    from rich.table import Table

    table = Table(title="where student and teacher disagree most (logprobs)", title_justify="left")
    for name in ("pos", "token", "student", "teacher", "student - teacher"):
        table.add_column(name, justify="left" if name == "token" else "right")
    for pos, token_id, s, t in rows:
        text = repr(decode(token_id)) if decode is not None else f"id {token_id}"
        table.add_row(str(pos), text, f"{s:.3f}", f"{t:.3f}", f"{s - t:+.3f}")
    return table


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v:.3g}" for k, v in value.items())
    return f"{value:.3g}"
