"""The subtraction game with TRL's GRPOTrainer: Forge's multi-turn run, side by side.

    python -m forge.cli run --config benchmarks/credit/subtraction.yaml --run-dir DIR  # Forge
    python -m benchmarks.credit.trl_multiturn --model DIR/sft/model --steps 200 --seed 0 \\
        [--threads 1] [--out trl.json] [--max-tokens 3] [--entropy-coef 0]              # TRL

Both start from the same SFT model (``DIR/sft/model``, made by Forge's run) and play
``benchmarks.credit.subtraction`` (``Subtraction`` against a random opponent, tasks from
``Piles(seed=2).sample()``). TRL (``trl==1.16``) gets the budget of ``subtraction.yaml``'s
``grpo:``: 8 prompts x 8 episodes (``num_generations``) per step, one optimizer step per
generation batch (``per_device_train_batch_size=64``, one accumulation step), AdamW at 2e-4
with a constant rate, grad-norm clip 1.0, temperature 1.0, no KL (``beta=0``), at most 3 new
tokens per turn and 8 turns, fp32 on CPU (``use_cpu``), no vLLM, eager attention, ``--threads``
torch threads. The loss is TRL's default: ``loss_type="dapo"`` (token-level sum over the
batch's sampled tokens), ``scale_rewards="group"`` (``(r - mean) / std`` per group, unbiased
std), ``epsilon=0.2`` clipping (inactive: one iteration per batch, so the ratio is 1).
``--max-tokens 1 --entropy-coef 0.2`` gives TRL what Forge's capped-bonus runs use where its
API has it: one-token moves and TRL's ``entropy_coef`` (the mean per-token entropy of the
full next-token distribution, not Forge's capped sampled estimate).

Episodes come from TRL's ``rollout_func``: TRL hands it the step's 64 prompts (each task 8
times, by its ``RepeatSampler``) and it plays the 64 games, one ``generate`` call per turn
over all unfinished games (left-padded; the trainer's current model, TRL's own sampling
config with 3 new tokens; logprobs from the logits). The token layout is Forge's
(``forge.envs.runner``, built with the same ``ChatRenderer``): prompt = chat template of
``reset``'s message + generation prompt; then per turn the sampled ids verbatim
(``env_mask`` 1), and, unless the game ended, the template's closing tokens and the next
observation's user message + generation prompt (``env_mask`` 0). ``completion_ids`` is all
of it after the prompt; the game's ``success`` is an extra field that the reward returns.

Evaluation as Forge's: greedy games on ``Piles(heldout_repeats=8).heldout()`` (each start pile 8 times), success
= the ``success`` reward, before training (the SFT start) and after; the opponent's seeds
are the same in both. ``sampled`` is the mean logged reward (sampled success) of the last 10
steps; ``minutes`` the wall time of ``trainer.train()`` (Forge's ``minutes`` also holds its
SFT and evaluations). The last line: ``success_rate=<after> baseline=<before>
sampled=<last 10 steps> minutes=<m>``.

Differences from Forge's run that TRL's setup forces or that remain:

- Forge drops groups whose 8 rewards are equal (``filter: nonzero_variance``, drawing up to
  2x the tasks to fill 8 groups); TRL has no filter: such groups get advantage 0 but their
  tokens still count in the DAPO normaliser, so a step holds fewer informative groups.
- Forge is off-by-one asynchronous (``max_policy_age: 1``, a truncated-IS weight capped at
  2 against the generator's logprobs); TRL generates then trains, strictly on-policy (the
  logprobs returned here are not used without vLLM). Forge's advantage std is the population
  std (TRL's: unbiased, x sqrt(8/7)).
- Forge samples each episode alone in its generator; here turns are batched with left
  padding (RoPE is relative, so the padding does not change the distribution).
- Opponents: Forge seeds none; here each game's opponent is seeded from ``--seed``.
- ``max_context_tokens: 400`` is not enforced; 8 turns of this game stay under 300 tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import re
import statistics
import time
from pathlib import Path

from benchmarks.credit.subtraction import Piles, Subtraction, random_success_rate
from benchmarks.e2e import cpu_grpo_config
from forge.envs.chat import ChatRenderer
from forge.envs.messages import to_messages

PROMPTS, GROUP, MAX_TOKENS, MAX_TURNS, LR = 8, 8, 3, 8, 2e-4
_PILE = re.compile(r"Pile (\d+)")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the SFT model (HF dir), e.g. RUN/sft/model")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument(
        "--entropy-coef",
        type=float,
        default=0.0,
        help="TRL's entropy_coef (the mean per-token entropy of the full "
        "distribution; 0: off, TRL's default)",
    )
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="new tokens per turn")
    args = p.parse_args(argv)
    if args.steps < 1 or args.threads < 1 or args.max_tokens < 1 or args.entropy_coef < 0:
        p.error("--steps, --threads and --max-tokens must be >= 1, --entropy-coef >= 0")
    return args


class Games:
    """Plays batches of whole games; ``model`` generates each turn of all unfinished games."""

    def __init__(self, tokenizer, seed: int) -> None:
        self.tok, self.chat = tokenizer, ChatRenderer(tokenizer)
        self.rng = random.Random(seed)  # the opponents' seeds

    def play(self, model, gen_config, piles: list[int], seeds: list[int] | None = None):
        """One dict per game: ``prompt``, ``ids``, ``mask``, ``logprobs`` (after the prompt),
        ``success``, ``turns``."""
        seeds = seeds or [self.rng.getrandbits(32) for _ in piles]
        return asyncio.run(self._play(model, gen_config, piles, seeds))

    async def _play(self, model, gen_config, piles, seeds) -> list[dict]:
        games = []
        for pile, seed in zip(piles, seeds):
            env = Subtraction(seed=seed)
            messages = to_messages(await env.reset({"pile": pile}))
            games.append(
                {
                    "env": env,
                    "messages": messages,
                    "prompt": self.chat.prompt_ids(messages),
                    "ids": [],
                    "mask": [],
                    "logprobs": [],
                    "success": 0.0,
                    "turns": 0,
                }
            )
        live = list(games)
        for turn in range(MAX_TURNS):
            if not live:
                break
            sampled = self.generate(model, gen_config, [g["prompt"] + g["ids"] for g in live])
            still = []
            for g, (ids, logps) in zip(live, sampled):
                g["ids"] += ids
                g["mask"] += [1] * len(ids)
                g["logprobs"] += logps
                g["turns"] += 1
                history = [*g["messages"], {"role": "assistant", "content": self.decode(ids)}]
                r = await g["env"].step(history[-1]["content"])
                if r.done or turn == MAX_TURNS - 1:
                    g["success"] = float((r.reward or {}).get("success", 0.0)) if r.done else 0.0
                    continue
                new = to_messages(r.observation)
                context = self.chat.close_ids(ids) + self.chat.suffix_ids(history, new)
                g["ids"] += context
                g["mask"] += [0] * len(context)
                g["logprobs"] += [0.0] * len(context)
                g["messages"] = history + new
                still.append(g)
            live = still
        return games

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def generate(self, model, gen_config, contexts: list[list[int]]):
        """``(sampled ids up to and including the first EOS, their logprobs)`` per context."""
        import torch

        width, pad = max(map(len, contexts)), self.tok.pad_token_id
        ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        attn = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        gen_config = copy.deepcopy(gen_config)
        gen_config.output_logits = gen_config.return_dict_in_generate = True
        out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gen_config)
        new = out.sequences[:, width:]
        temp = gen_config.temperature if gen_config.do_sample else 1.0  # (raw logits)
        logps = (torch.stack(out.logits, 1).float() / temp).log_softmax(-1)
        logps = logps.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        eos = gen_config.eos_token_id
        eos = {eos} if isinstance(eos, int) else set(eos)
        result = []
        for row, lp in zip(new.tolist(), logps.tolist()):
            n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            result.append((row[:n], lp[:n]))
        return result


def success_reward(prompts, completions, success, **kwargs) -> list[float]:
    """The game's ``success`` (1 win, 0 loss or illegal move), from ``rollout_func``."""
    return [float(s) for s in success]


def trl_config(
    out_dir: Path, steps: int, seed: int, max_tokens: int = MAX_TOKENS, entropy_coef: float = 0.0
):
    # max_tokens is per turn (the rollout_func's generate); the tasks keep Piles(seed=2)'s order.
    return cpu_grpo_config(
        out_dir,
        prompts=PROMPTS,
        group=GROUP,
        max_tokens=max_tokens,
        lr=LR,
        steps=steps,
        seed=seed,
        shuffle_dataset=False,
        entropy_coef=entropy_coef,
    )


def run(args: argparse.Namespace) -> dict:
    import os
    import tempfile

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import GenerationConfig, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer
    from trl.models import unwrap_model_for_generation

    torch.set_num_threads(args.threads)
    source = Piles(seed=2)  # the task stream of subtraction.yaml's rl.data
    rows = [source.sample() for _ in range(PROMPTS * (args.steps + 1))]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "pile": r["pile"]} for r in rows]
    )
    holder: dict = {}

    def rollout_func(prompts, trainer) -> dict:
        piles = [int(_PILE.search(p[-1]["content"]).group(1)) for p in prompts]
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                trainer.accelerator,
                generation_kwargs=trainer.generation_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            games = holder["games"].play(model, trainer.generation_config, piles)
        holder["turns"].append(statistics.fmean(g["turns"] for g in games))
        return {
            "prompt_ids": [g["prompt"] for g in games],
            "completion_ids": [g["ids"] for g in games],
            "logprobs": [g["logprobs"] for g in games],
            "env_mask": [g["mask"] for g in games],
            "success": [g["success"] for g in games],
        }

    marks: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, _args, state, control, **kw):
            marks.append(time.perf_counter())

    with tempfile.TemporaryDirectory(prefix="forge-trl-mt-") as tmp:
        trainer = GRPOTrainer(
            model=str(args.model),
            reward_funcs=success_reward,
            args=trl_config(Path(tmp), args.steps, args.seed, args.max_tokens, args.entropy_coef),
            train_dataset=dataset,
            rollout_func=rollout_func,
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)
        tok = trainer.processing_class
        holder.update(games=Games(tok, args.seed), turns=[])
        greedy = GenerationConfig(
            max_new_tokens=args.max_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=trainer.eos_token_ids,
            disable_compile=True,
        )
        tasks = Piles(heldout_repeats=8).heldout()  # as subtraction.yaml
        opponents = random.Random(args.seed + 1)
        eval_seeds = [opponents.getrandbits(32) for _ in tasks]  # the same before and after

        def evaluate() -> float:
            model = trainer.accelerator.unwrap_model(trainer.model)
            was_training = model.training
            model.eval()
            with torch.no_grad():
                games = holder["games"].play(model, greedy, [t["pile"] for t in tasks], eval_seeds)
            model.train(was_training)
            return statistics.fmean(g["success"] for g in games)

        before = evaluate()
        t0 = time.perf_counter()
        marks.append(t0)
        trainer.train()
        minutes = (time.perf_counter() - t0) / 60
        after = evaluate()
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    steps = [b - a for a, b in zip(marks, marks[1:])]
    return {
        "success_rate": after,
        "baseline": before,
        "sampled": statistics.fmean(rewards[-10:]),
        "sampled_first": statistics.fmean(rewards[:10]),
        "random": random_success_rate(),
        "minutes": minutes,
        "s_per_step": minutes * 60 / len(steps),
        "s_per_step_median": statistics.median(steps),
        "mean_turns": statistics.fmean(holder["turns"]),
        "rewards": rewards,
        "steps": args.steps,
        "seed": args.seed,
        "threads": args.threads,
        "model": str(args.model),
        "loss": "trl default: loss_type=dapo, scale_rewards=group, epsilon=0.2, beta=0",
        "entropy_coef": args.entropy_coef,
        "max_tokens": args.max_tokens,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    r = run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(r, indent=2) + "\n")
    print(
        f"[trl-multiturn] {r['s_per_step']:.2f} s/step (median {r['s_per_step_median']:.2f}), "
        f"mean turns {r['mean_turns']:.2f}, sampled_first={r['sampled_first']:.3f}, "
        f"random={r['random']:.3f}",
        flush=True,
    )
    print(
        f"success_rate={r['success_rate']:.3f} baseline={r['baseline']:.3f} "
        f"sampled={r['sampled']:.3f} minutes={r['minutes']:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
