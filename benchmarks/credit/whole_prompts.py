"""``exact_advantages``' estimated rows again, with the real runs' prompts: the whole game so far.

    python -m benchmarks.credit.whole_prompts [--seeds 0 1 2] [--steps 300]
        [--advantages state_baseline] [--entropy-coef 0.1] [--entropy exact|sampled]

The same model, SFT (150 steps of random legal games, batch 32, lr 1e-3) and policy-gradient
steps (8 start piles x 8 games, AdamW lr 2e-4, gradient norm clipped at 1) as
``benchmarks/credit/exact_advantages.py`` with ``--advantages <estimator>``, but every turn's
prompt is the conversation so far, rendered with Forge's ``ChatRenderer`` as the runner
renders it (so the policy may depend on the history and no exact program exists). Held-out
success is played, as the real runs play it: greedy moves, each start pile 8 times against a
seeded random opponent (72 games). Compare its numbers with ``exact_advantages``' rows of
the same estimator: the difference is the prompt alone.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch

from benchmarks.credit.exact_advantages import (
    _credit,
    _estimator,
    common_args,
    next_token_logprobs,
    non_move,
    pg_step,
)
from benchmarks.credit.subtraction import MOVES, intro, observe, start_piles


class WholePolicy:
    """The model's first-token log-probabilities after any conversation, batched."""

    def __init__(self, preset: str, seed: int, init: str | None = None):
        from forge.envs.chat import ChatRenderer
        from forge.models import load_model, load_tokenizer, make_tiny_model

        path = init or make_tiny_model(tempfile.mkdtemp(prefix="whole-"), preset=preset, seed=seed)
        tok = load_tokenizer(path)
        self.model, self.chat = load_model(path), ChatRenderer(tok)
        self.digits = [tok.encode(str(k), add_special_tokens=False)[0] for k in MOVES]

    def logprobs(self, conversations: list[list[dict]]) -> torch.Tensor:
        """``[len(conversations), vocab]`` next-token log-probabilities (with grad)."""
        return next_token_logprobs(self.model, [self.chat.prompt_ids(c) for c in conversations])


def play(policy: WholePolicy, piles: list[int], rng: random.Random, mode: str):
    """Games from ``piles`` in lockstep; ``mode`` is ``sample``, ``greedy`` or ``random``
    (uniform legal moves, for SFT data). Returns, per game, its turns as
    ``(conversation before the move, (pile, first turn?), take)`` (take 0: an illegal token
    or a token that is no move)."""
    games = [
        {"pile": p, "msgs": [{"role": "user", "content": intro(p)}], "turns": []} for p in piles
    ]
    live = list(games)
    while live:
        if mode == "random":
            takes = [rng.choice([k for k in MOVES if k <= g["pile"]]) for g in live]
        else:
            with torch.no_grad():
                logp = policy.logprobs([g["msgs"] for g in live])
            tokens = (
                logp.argmax(-1)
                if mode == "greedy"
                else torch.multinomial(logp.exp(), 1, generator=_torch_rng(rng))[:, 0]
            ).tolist()
            takes = [policy.digits.index(t) + 1 if t in policy.digits else 0 for t in tokens]
        still = []
        for g, take in zip(live, takes):
            state = (g["pile"], len(g["turns"]) == 0)
            g["turns"].append((list(g["msgs"]), state, take))
            if take == 0 or take >= g["pile"]:  # illegal, or the model takes the last stone
                continue
            g["pile"] -= take
            g["pile"] -= rng.choice([k for k in MOVES if k <= g["pile"]])
            if g["pile"] == 0:
                continue
            g["msgs"] += [
                {"role": "assistant", "content": str(take)},
                {"role": "user", "content": observe(g["pile"])},
            ]
            still.append(g)
        live = still
    return [g["turns"] for g in games]


def _torch_rng(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.getrandbits(63))


def won(turns) -> bool:
    _, (pile, _), take = turns[-1]
    return take == pile


def heldout(policy: WholePolicy) -> float:
    piles = [p for p in start_piles(5, 15) for _ in range(8)]
    games = play(policy, piles, random.Random(1234), "greedy")
    return sum(map(won, games)) / len(games)


def train(args: argparse.Namespace, seed: int) -> dict:
    torch.manual_seed(seed)
    policy, rng = WholePolicy(args.preset, seed, args.init), random.Random(seed + 2)
    opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-3, weight_decay=0.0)
    data_rng = random.Random(seed + 1)
    for _ in range(0 if args.init else args.sft_steps):
        games = play(policy, data_rng.choices(start_piles(5, 15), k=32), data_rng, "random")
        turns = [t for g in games for t in g]
        logp = policy.logprobs([m for m, _, _ in turns])
        targets = torch.tensor([policy.digits[take - 1] for _, _, take in turns])
        loss = -logp[torch.arange(len(turns)), targets].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    curve = {0: heldout(policy)}
    opt = torch.optim.AdamW(policy.model.parameters(), lr=args.lr, weight_decay=0.0)
    estimator, t0 = _estimator(args.advantages), time.monotonic()
    illegal_rng = random.Random(seed + 3) if args.illegal == "sampled" else None
    for step in range(1, args.steps + 1):
        rows, adv = [], []
        starts = [p for p in rng.choices(start_piles(5, 15), k=8) for _ in range(8)]
        played = play(policy, starts, rng, "sample")  # all 64 games in one batch
        for i in range(0, len(played), 8):
            games = played[i : i + 8]
            short = [[(state, take) for _, state, take in g] for g in games]
            for g, credit in zip(games, _credit(args, estimator, short, None, None)):
                rows += [(msgs, take) for msgs, _, take in g[: len(credit)]]
                adv += credit
        if rows:
            logp = policy.logprobs([m for m, _ in rows])
            tokens = [
                policy.digits[t - 1] if t else non_move(logp[i], policy.digits, illegal_rng)
                for i, (_, t) in enumerate(rows)
            ]
            pg_step(args, opt, policy.model, logp, tokens, adv)
        if step % 50 == 0 or step == args.steps:
            curve[step] = heldout(policy)
            print(
                f"  seed {seed} step {step}: held out {curve[step]:.3f} "
                f"({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    return {"seed": seed, "curve": curve}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(p, steps=300, entropy_coef=0.1, entropy="sampled")
    p.add_argument(
        "--advantages", choices=["episode", "gigpo", "state_baseline"], default="state_baseline"
    )
    args = p.parse_args()
    args.per_state_norm = False
    print(f"whole-game prompts: {vars(args)}", flush=True)
    results = [train(args, s) for s in args.seeds]
    finals = [r["curve"][args.steps] for r in results]
    starts = [r["curve"][0] for r in results]
    print(
        f"held-out success after SFT {statistics.median(starts):.3f}, after {args.steps} steps "
        f"{statistics.median(finals):.3f} [{min(finals):.3f}-{max(finals):.3f}] "
        f"(per seed {[round(x, 3) for x in finals]}); the optimal rule 1.000"
    )


if __name__ == "__main__":
    main()
