"""What a subtraction-game policy does in each state: its probability of taking 1, 2 and 3.

    python -m benchmarks.credit.policy_table RUN_DIR [RUN_DIR ...]

For each run directory of ``benchmarks/credit/run.py`` (``<keep>/subtraction-<method>-s<seed>/
run``) it loads the SFT model and the final RL policy (``sft/model``, ``rl/model``) and prints,
for every start pile and for every pile met after a first move, the move probabilities (the
prompt rendered with Forge's own ``ChatRenderer`` through the run's ``env.history`` window, as
in training), the optimal move, and the
exact success rate against the random opponent of the policy's greedy moves, next to that of
the optimal rule. This is how a plateau is read: a policy whose greedy move ignores the pile
until the endgame shows as the same column everywhere.
"""

from __future__ import annotations

import argparse
from functools import lru_cache
from pathlib import Path

import torch

from benchmarks.credit.subtraction import MOVES, intro, observe, optimal_move, start_piles
from forge.config.loader import load_config_dict
from forge.envs import HistoryWindow, window_messages
from forge.envs.chat import ChatRenderer
from forge.models import load_model, load_tokenizer


def move_probs(model, chat: ChatRenderer, tok, messages: list[dict]) -> list[float]:
    """P(take k) for k in 1..3: the next-token probability of the digit after the prompt."""
    ids = torch.tensor([chat.prompt_ids(messages)])
    with torch.no_grad():
        probs = model(ids).logits[0, -1].softmax(-1)
    digits = [tok.encode(str(k), add_special_tokens=False)[0] for k in MOVES]
    return [float(probs[d]) for d in digits]


def greedy_success(first: dict[int, int], later: dict[int, int], piles: list[int]) -> float:
    """Exact win rate against the uniformly random opponent when the model takes
    ``first[pile]`` on its first move and ``later[pile]`` afterwards (an illegal take loses),
    averaged over the start ``piles``."""

    def outcome(pile: int, take: int) -> float:
        if take > pile:
            return 0.0
        left = pile - take
        if left == 0:
            return 1.0
        legal = [k for k in MOVES if k <= left]
        return sum(0.0 if left == k else win(left - k) for k in legal) / len(legal)

    @lru_cache(None)
    def win(pile: int) -> float:
        return outcome(pile, later[pile])

    return sum(outcome(p, first[p]) for p in piles) / len(piles)


def run_window(run: str) -> HistoryWindow | None:
    """The run's ``rl.env.history`` (from its resolved ``config.yaml``), if it set one."""
    path = Path(run) / "config.yaml"
    history = load_config_dict(path)["rl"]["env"].get("history") if path.exists() else None
    return HistoryWindow(**history) if history else None


def table(model_dir: str, label: str, window: HistoryWindow | None = None) -> None:
    tok = load_tokenizer(model_dir)
    model, chat = load_model(model_dir).eval(), ChatRenderer(tok)
    piles = start_piles(5, 15)
    print(f"{label}: {model_dir}")
    print("  state      optimal  P(1)  P(2)  P(3)  greedy")
    first, later = {}, {}
    rows = [("start", pile, [{"role": "user", "content": intro(pile)}]) for pile in piles]
    rows += [
        (
            "later",
            pile,
            [
                {"role": "user", "content": intro(15)},  # after "take 3" from 15
                {"role": "assistant", "content": "3"},
                {"role": "user", "content": observe(pile)},
            ],
        )
        for pile in range(1, 16)
    ]
    for kind, pile, messages in rows:
        if window is not None:
            messages = window_messages(messages, window)
        probs = move_probs(model, chat, tok, messages)
        move = 1 + max(range(3), key=probs.__getitem__)
        (first if kind == "start" else later)[pile] = move
        cells = "  ".join(f"{x:.2f}" for x in probs)
        print(f"  {kind} {pile:>2}  {optimal_move(pile):>7}  {cells}  {move}")
    optimal = {p: optimal_move(p) for p in range(1, 16)}
    print(
        f"  greedy success (exact): {greedy_success(first, later, piles):.3f}; "
        f"the optimal rule {greedy_success(optimal, optimal, piles):.3f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run directories (with sft/model and rl/model)")
    for run in p.parse_args().runs:
        for stage in ("sft", "rl"):
            if (Path(run) / stage / "model").exists():
                table(str(Path(run) / stage / "model"), stage, run_window(run))


if __name__ == "__main__":
    main()
