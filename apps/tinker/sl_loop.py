"""A supervised loop written against the Tinker SDK only (nothing from Forge is imported):
``forward_backward`` with ``cross_entropy`` and per-token weights, ``optim_step``, then greedy
sampling from the trained weights.

The tiny CPU model learns to complete a few facts:

    export FORGE_API_KEY=tml-$(python -c 'import secrets; print(secrets.token_urlsafe(24))')
    forge serve &
    TINKER_API_KEY=$FORGE_API_KEY python -m apps.tinker.sl_loop --base-url http://127.0.0.1:8000

Prints the mean loss per completion token each step and ends with ``loss_first=``,
``loss_last=`` and ``exact=`` (the share of prompts whose greedy completion is the target).
"""

from __future__ import annotations

import argparse
import time

import tinker
from tinker import types

FACTS = [
    ("The capital of France is", " Paris."),
    ("The capital of Japan is", " Tokyo."),
    ("Two plus two is", " four."),
    ("The sky is", " blue."),
]


def datum(tokenizer, prompt: str, completion: str) -> types.Datum:
    """Weights 1 on the completion's tokens (and the end of text), 0 on the prompt's."""
    p = tokenizer.encode(prompt)
    c = tokenizer.encode(completion) + [tokenizer.eos_token_id]
    tokens = p + c
    weights = [0.0] * (len(p) - 1) + [1.0] * len(c)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--base-model", default="forge/tiny")
    p.add_argument("--steps", type=int, default=250)
    # 1e-2 sits at the edge of instability for this model (1.2e-2 stalls at loss ~0.3).
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--rank", type=int, default=16)
    args = p.parse_args()

    service = tinker.ServiceClient(base_url=args.base_url)
    training = service.create_lora_training_client(
        base_model=args.base_model, rank=args.rank
    ).result()
    tokenizer = training.get_tokenizer()
    data = [datum(tokenizer, q, a) for q, a in FACTS]
    n_tokens = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in data)
    losses = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        fwd_bwd = training.forward_backward(data, "cross_entropy")
        optim = training.optim_step(types.AdamParams(learning_rate=args.lr))
        losses.append(fwd_bwd.result().metrics["loss:sum"] / n_tokens)
        optim.result()
        print(f"step {step}: loss {losses[-1]:.3f} ({time.perf_counter() - t0:.2f} s)", flush=True)

    sampler = training.save_weights_and_get_sampling_client().result()
    greedy = types.SamplingParams(max_tokens=16, temperature=0.0)
    right = 0
    for q, a in FACTS:
        out = sampler.sample(types.ModelInput.from_ints(tokenizer.encode(q)), 1, greedy).result()
        text = tokenizer.decode(out.sequences[0].tokens, skip_special_tokens=True)
        right += text == a
        print(f"{q!r} -> {text!r}", flush=True)
    print(
        f"loss_first={losses[0]:.3f} loss_last={losses[-1]:.3f} exact={right / len(FACTS):.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
