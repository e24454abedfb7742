"""An RL loop written against the Tinker SDK only (nothing from Forge is imported): sample,
reward, importance-sampling ``forward_backward``, ``optim_step``, new sampling client.

The task is small enough for the tiny CPU model to learn in a minute: the reward of a
completion is the share of its characters that are lowercase letters (about 10% of what the
untrained model writes).

    export FORGE_API_KEY=tml-$(python -c 'import secrets; print(secrets.token_urlsafe(24))')
    forge serve &            # in another terminal (or tmux)
    TINKER_API_KEY=$FORGE_API_KEY python -m apps.tinker.rl_loop --base-url http://127.0.0.1:8000

Prints one line per step (mean reward, seconds) and ends with ``first=`` and ``last=``: the
mean reward of the first and last steps.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tinker
from tinker import types

PROMPTS = ["Count: ", "Numbers: ", "Digits: ", "Write: "]


TASKS = {"lower": ("a", "z"), "upper": ("A", "Z")}


def reward(text: str, task: str = "lower") -> float:
    """Share of characters that are lowercase (``task="upper"``: uppercase) ASCII letters
    (0 for an empty completion)."""
    lo, hi = TASKS[task]
    return sum(lo <= c <= hi for c in text) / len(text) if text else 0.0


def datum(prompt: list[int], seq, advantage: float) -> types.Datum:
    """Prompt + completion as one datum: only the completion's tokens carry the advantage."""
    tokens = prompt + list(seq.tokens)
    n_prompt = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * n_prompt + list(seq.logprobs),
            "advantages": [0.0] * n_prompt + [advantage] * len(seq.tokens),
        },
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--base-model", default="forge/tiny")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--lr", type=float, default=2e-2)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--task", choices=sorted(TASKS), default="lower", help="which letters pay")
    args = p.parse_args()

    service = tinker.ServiceClient(base_url=args.base_url)
    training = service.create_lora_training_client(
        base_model=args.base_model, rank=args.rank
    ).result()
    tokenizer = training.get_tokenizer()
    params = types.SamplingParams(max_tokens=12, temperature=1.0)
    means, t_loop = [], time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        sampler = training.save_weights_and_get_sampling_client().result()
        t1 = time.perf_counter()
        prompts = [tokenizer.encode(p) for p in PROMPTS]
        futures = [
            sampler.sample(
                types.ModelInput.from_ints(p), num_samples=args.group, sampling_params=params
            )
            for p in prompts
        ]
        data, rewards = [], []
        for prompt, fut in zip(prompts, futures):
            seqs = fut.result().sequences
            texts = [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in seqs]
            r = np.array([reward(t, args.task) for t in texts])
            rewards.extend(r)
            adv = (r - r.mean()) / (r.std() + 1e-6)
            data += [datum(prompt, s, float(a)) for s, a in zip(seqs, adv) if a != 0]
        t2 = time.perf_counter()
        if data:
            training.forward_backward(data, "importance_sampling")
            training.optim_step(types.AdamParams(learning_rate=args.lr)).result()
        t3 = time.perf_counter()
        means.append(float(np.mean(rewards)))
        print(
            f"step {step}: reward {means[-1]:.3f} ({t3 - t0:.2f} s: save {t1 - t0:.4f} "
            f"sample {t2 - t1:.4f} train {t3 - t2:.4f})",
            flush=True,
        )
    seconds = time.perf_counter() - t_loop
    print(f"first={means[0]:.3f} last={means[-1]:.3f} seconds={seconds:.2f}", flush=True)


if __name__ == "__main__":
    main()
