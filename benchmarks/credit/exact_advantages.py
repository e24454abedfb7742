"""The subtraction game trained with exact advantages (or Forge's estimators) in one process.

    python -m benchmarks.credit.exact_advantages [--seeds 0 1 2] [--steps 200] [--lr 2e-4]
        [--advantages exact|episode|gigpo|state_baseline] [--entropy-coef 0.0]
        [--entropy exact|sampled] [--entropy-cap NATS] [--illegal argmax|sampled]
        [--per-state-norm] [--keep-all] [--init MODEL_DIR] [--preset mini]

Every credit estimator (``episode``, ``gigpo``, ``state_baseline``, PPO's critic) estimates
``A(s, a) = Q(s, a) - V(s)`` from sampled returns. With ``--advantages exact`` (the default)
this benchmark removes the estimation: each sampled turn is credited with its exact advantage
under the current policy, computed by dynamic programming over the piles from the policy's
own move probabilities. What the policy still fails to learn then is not a failure of credit
assignment. The other choices run Forge's own estimator (``forge.losses.turn_credit``) on the
sampled games' outcomes instead (GRPO's episode advantages; a group whose games all end
alike is dropped, as the benchmark's ``filter: nonzero_variance`` does), on the same prompts.

For the program to be exact the policy sees only the current observation (the first turn's
``intro(pile)``, later ``Pile N.``), rendered with Forge's ``ChatRenderer``, so one forward
pass over the 24 distinct prompts gives the whole policy. That is an easier problem than the
benchmark's, whose prompts hold the whole game so far. Otherwise the setting is the
benchmark's (``benchmarks/credit/subtraction.yaml``): the base model at ``--preset``/seed, 150
SFT steps on random legal games (batch 32, lr 1e-3, the move's first token), then ``--steps``
policy-gradient steps of 8 start piles x 8 games (AdamW at ``--lr``, gradient norm clipped at
1; exact advantages divided by their RMS, or by their standard deviation under the policy in
each state with ``--per-state-norm``). ``--entropy-coef`` adds an entropy bonus at the
sampled turns' states: the exact entropy of the next-token distribution, or (``sampled``)
estimated from the sampled tokens as Forge's ``trainer.loss.entropy_coef`` is (each token's
weight capped at ``--entropy-cap`` nats, as ``trainer.loss.entropy_cap``). A first token
that is not 1, 2 or 3 is an illegal move; the token trained for it is, with ``--illegal
sampled``, one drawn from the model's distribution over the tokens that are no move (what
the sampler drew, as in Forge's runs), and by default the likeliest of them (the rows of
docs/benchmarks.md before 2026-11-25; that stand-in hid what the sampled entropy estimate
does to the vocabulary's tail). ``--init`` starts from a saved model (e.g. a Forge run's
``sft/model``) instead of the SFT here.

Prints, per seed, the exact greedy success against the random opponent after SFT and every
50 steps, and the final greedy move per pile; the optimal rule wins 1.000.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from functools import lru_cache

import torch

from benchmarks.credit.subtraction import MOVES, intro, observe, optimal_move, start_piles

PILES = range(1, 16)


def next_token_logprobs(model, prompts: list[list[int]]) -> torch.Tensor:
    """``[len(prompts), vocab]`` log-probabilities of the token after each prompt (with
    grad): one batch, left-padded so that the next token is at the last column."""
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(prompts):
        ids[i, width - len(x) :] = torch.tensor(x)
        mask[i, width - len(x) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos)
    return out.logits[:, -1].log_softmax(-1)


class Policy:
    """The model's move distribution in every (pile, first turn?) state, one batch away."""

    def __init__(self, preset: str, seed: int, init: str | None = None):
        from forge.envs.chat import ChatRenderer
        from forge.models import load_model, load_tokenizer, make_tiny_model

        path = init or make_tiny_model(
            tempfile.mkdtemp(prefix="exact-adv-"), preset=preset, seed=seed
        )
        tok = load_tokenizer(path)
        self.model, chat = load_model(path), ChatRenderer(tok)
        self.digits = [tok.encode(str(k), add_special_tokens=False)[0] for k in MOVES]
        self.states = [(p, True) for p in start_piles(5, 15)] + [(p, False) for p in PILES]
        prompts = [
            chat.prompt_ids([{"role": "user", "content": intro(p) if first else observe(p)}])
            for p, first in self.states
        ]
        self.prompts = prompts
        self.index = {s: i for i, s in enumerate(self.states)}

    def logprobs(self) -> torch.Tensor:
        """``[state, vocab]`` next-token log-probabilities (with grad)."""
        return next_token_logprobs(self.model, self.prompts)

    def move_probs(self, logp: torch.Tensor) -> dict[tuple[int, bool], list[float]]:
        """P(take k) for k = 1..3 in every state; the rest of the vocabulary is illegal."""
        p = logp.detach().exp()[:, self.digits].tolist()
        return {s: p[i] for s, i in self.index.items()}


def exact_q(probs: dict[tuple[int, bool], list[float]]) -> dict[tuple[int, bool], list[float]]:
    """``Q(s, take)`` for take 0 (illegal), 1, 2, 3 under the policy ``probs``, and ``V(s)``
    last: the model's win probability against the uniformly random opponent."""

    def q(pile: int, take: int) -> float:
        if take == 0 or take > pile:
            return 0.0
        left = pile - take
        if left == 0:
            return 1.0
        replies = [k for k in MOVES if k <= left]
        return sum(v(left - r) if left > r else 0.0 for r in replies) / len(replies)

    @lru_cache(None)
    def v(pile: int, first: bool = False) -> float:
        return sum(pr * q(pile, k) for k, pr in zip(MOVES, probs[(pile, first)]))

    return {(p, f): [q(p, t) for t in (0, *MOVES)] + [v(p, f)] for p, f in probs}


def greedy_success(probs: dict[tuple[int, bool], list[float]]) -> float:
    """Exact win rate of the policy's greedy moves over the start piles."""
    greedy = {
        s: [float(k == max(range(3), key=pr.__getitem__)) for k in range(3)]
        for s, pr in probs.items()
    }
    q = exact_q(greedy)
    piles = start_piles(5, 15)
    return sum(q[(p, True)][-1] for p in piles) / len(piles)


def play(probs: dict, pile: int, rng: random.Random) -> list[tuple[tuple[int, bool], int]]:
    """One sampled game: its ``(state, take)`` turns (take 0: an illegal token)."""
    turns, first = [], True
    while True:
        pr = probs[(pile, first)]
        take = rng.choices([0, *MOVES], weights=[max(0.0, 1 - sum(pr)), *pr])[0]
        turns.append(((pile, first), take))
        if take == 0 or take > pile or take == pile:
            return turns
        pile -= take
        pile -= rng.choice([k for k in MOVES if k <= pile])
        if pile == 0:
            return turns
        first = False


def sft(policy: Policy, steps: int, seed: int) -> None:
    """Cross-entropy on random legal moves in the states of random games (batch 32 games)."""
    rng = random.Random(seed + 1)
    uniform = {
        s: [1 / len([k for k in MOVES if k <= s[0]]) if k <= s[0] else 0.0 for k in MOVES]
        for s in policy.states
    }
    opt = torch.optim.AdamW(policy.model.parameters(), lr=1e-3, weight_decay=0.0)
    for _ in range(steps):
        rows, targets = [], []
        for _ in range(32):
            for state, take in play(uniform, rng.choice(start_piles(5, 15)), rng):
                rows.append(policy.index[state])
                targets.append(policy.digits[take - 1])
        logp = policy.logprobs()
        loss = -logp[torch.tensor(rows), torch.tensor(targets)].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(args: argparse.Namespace, seed: int) -> dict:
    torch.manual_seed(seed)
    policy, rng = Policy(args.preset, seed, args.init), random.Random(seed + 2)
    if args.init is None:
        sft(policy, args.sft_steps, seed)
    opt = torch.optim.AdamW(policy.model.parameters(), lr=args.lr, weight_decay=0.0)
    illegal_rng = random.Random(seed + 3) if args.illegal == "sampled" else None
    estimator = _estimator(args.advantages)
    with torch.no_grad():
        curve = {0: greedy_success(policy.move_probs(policy.logprobs()))}
    t0, entropy = time.monotonic(), float("nan")
    for step in range(1, args.steps + 1):
        logp = policy.logprobs()
        probs = policy.move_probs(logp)
        q = exact_q(probs)
        rows, tokens, adv = [], [], []
        for pile in rng.choices(start_piles(5, 15), k=8):
            games = [play(probs, pile, rng) for _ in range(8)]
            for turns, credit in zip(games, _credit(args, estimator, games, probs, q)):
                for (state, take), a in zip(turns, credit):
                    rows.append(policy.index[state])
                    tokens.append(
                        policy.digits[take - 1]
                        if take
                        else non_move(logp[policy.index[state]], policy.digits, illegal_rng)
                    )
                    adv.append(a)
        if adv:  # else every group was filtered out
            entropy = pg_step(args, opt, policy.model, logp[torch.tensor(rows)], tokens, adv)
        if step % 50 == 0 or step == args.steps:
            with torch.no_grad():
                curve[step] = greedy_success(policy.move_probs(policy.logprobs()))
            print(
                f"  seed {seed} step {step}: greedy {curve[step]:.3f} "
                f"entropy {entropy:.2f} ({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    with torch.no_grad():
        probs = policy.move_probs(policy.logprobs())
    moves = {s: 1 + max(range(3), key=pr.__getitem__) for s, pr in probs.items()}
    return {"seed": seed, "curve": curve, "moves": moves}


def pg_step(args, opt, model, logp_rows: torch.Tensor, tokens: list[int], adv) -> float:
    """One policy-gradient step on sampled turns: ``logp_rows`` ``[turn, vocab]`` (with grad),
    the token each sampled, its advantage; with the entropy bonus. Returns the turns' mean
    entropy. Exact advantages are divided by their RMS first (Forge's estimators scale
    their own)."""
    a = torch.tensor(adv)
    if args.advantages == "exact":
        a = a / (a.pow(2).mean().sqrt() + 1e-6)
    sampled = logp_rows[torch.arange(len(tokens)), torch.tensor(tokens)]
    entropy = -(logp_rows.exp() * logp_rows).sum(-1).mean()
    if args.entropy == "exact":
        bonus = -entropy
    else:  # estimated from the sampled tokens: gradient logp * grad logp, value 0
        w = sampled.detach()
        if args.entropy_cap is not None:  # as Forge's trainer.loss.entropy_cap
            w = w.clamp(min=-args.entropy_cap)
        bonus = (w * (sampled - sampled.detach())).mean()
    loss = -(a * sampled).mean() + args.entropy_coef * bonus
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(entropy)


def _estimator(name: str):
    """Forge's own estimator for ``--advantages`` (``None`` for exact)."""
    from forge.losses import turn_credit

    return {
        "exact": None,
        "episode": turn_credit.episode_credit,
        "gigpo": turn_credit.gigpo_credit,
        "state_baseline": turn_credit.StateBaselineCredit(),
    }[name]


def _credit(args, estimator, games, probs, q) -> list[list[float]]:
    """Per-turn advantages of one group of games (the same start pile): exact, or Forge's
    estimator on the games' outcomes (1 for a win, at the last turn) with GRPO's episode
    advantages. A group whose games all end alike is dropped, as the benchmark's
    ``filter: nonzero_variance`` does, except with exact advantages (they need no spread)."""
    if estimator is None:
        out = []
        for turns in games:
            row = []
            for state, take in turns:
                a = q[state][take] - q[state][-1]
                if args.per_state_norm:
                    pr = [max(0.0, 1 - sum(probs[state])), *probs[state]]
                    var = sum(w * (x - q[state][-1]) ** 2 for w, x in zip(pr, q[state]))
                    a /= var**0.5 + 0.02
                row.append(a)
            out.append(row)
        return out
    from forge.losses.advantages import grpo_advantages

    wins = [float(_won(turns)) for turns in games]
    if len(set(wins)) == 1 and not args.keep_all:
        return [[] for _ in games]
    rewards = [[0.0] * (len(t) - 1) + [w] for t, w in zip(games, wins)]
    states = [[state for state, _ in turns] for turns in games]
    episode = grpo_advantages(torch.tensor(wins), len(wins)).tolist()
    return estimator(rewards, states, episode)


def _won(turns: list[tuple[tuple[int, bool], int]]) -> bool:
    """Whether a game (its turns) ended with the model taking the last stone."""
    (pile, _), take = turns[-1]
    return take == pile


def non_move(row: torch.Tensor, digits: list[int], rng: random.Random | None = None) -> int:
    """The token that stands for a turn's illegal sample: with ``rng``, one drawn from
    ``row``'s distribution over the tokens that are no move (what a sampler that drew no
    move drew); without, the most likely of them."""
    row = row.detach().clone()
    row[digits] = float("-inf")
    if rng is None:
        return int(row.argmax())
    gen = torch.Generator().manual_seed(rng.getrandbits(63))
    return int(torch.multinomial(row.softmax(-1), 1, generator=gen))


def common_args(p: argparse.ArgumentParser, steps: int, entropy_coef: float, entropy: str):
    """The options both subtraction loops take."""
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--entropy-coef", type=float, default=entropy_coef)
    p.add_argument("--entropy", choices=["exact", "sampled"], default=entropy)
    p.add_argument("--preset", default="mini")
    p.add_argument(
        "--entropy-cap",
        type=float,
        default=None,
        help="with --entropy sampled: cap each sampled token's weight at this many nats, "
        "as Forge's trainer.loss.entropy_cap (default: no cap)",
    )
    p.add_argument(
        "--illegal",
        choices=["argmax", "sampled"],
        default="argmax",
        help="the token trained for a turn that sampled no move: the most likely non-move "
        "token, or one drawn as the sampler would (what Forge's runs train)",
    )
    p.add_argument(
        "--init",
        help="start from this model directory (e.g. a Forge run's "
        "sft/model) instead of a fresh one, and skip the SFT",
    )
    p.add_argument(
        "--keep-all",
        action="store_true",
        help="keep groups whose games all end alike (their turns still differ from their "
        "states' baselines); by default they are dropped, as filter: nonzero_variance does",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common_args(p, steps=200, entropy_coef=0.0, entropy="exact")
    p.add_argument(
        "--advantages", choices=["exact", "episode", "gigpo", "state_baseline"], default="exact"
    )
    p.add_argument("--per-state-norm", action="store_true")
    args = p.parse_args()
    print(f"exact advantages: {vars(args)}", flush=True)
    results = [train(args, s) for s in args.seeds]
    print("pile        " + " ".join(f"{n:>2}" for n in PILES))
    print("optimal     " + " ".join(f"{optimal_move(n):>2}" for n in PILES))
    for r in results:
        later = " ".join(f"{r['moves'][(n, False)]:>2}" for n in PILES)
        print(f"seed {r['seed']} later {later}")
    finals = [r["curve"][args.steps] for r in results]
    starts = [r["curve"][0] for r in results]
    print(
        f"greedy success after SFT {statistics.median(starts):.3f}, after {args.steps} steps "
        f"{statistics.median(finals):.3f} [{min(finals):.3f}-{max(finals):.3f}] "
        f"(seeds {args.seeds}); the optimal rule 1.000"
    )


if __name__ == "__main__":
    main()
