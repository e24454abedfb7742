"""One batch, two trainers: Forge's GRPO update against TRL's GRPOTrainer on the same samples.

    pip install 'trl==1.16.*'
    python -m benchmarks.same_update [--config short|gen-heavy] [--seeds 0 1 2]

The held-out comparison at equal steps (``benchmarks.real_heldout``) has a seed-to-seed spread
as large as the gap it measures. This removes the sampling: per seed, SmolLM2-135M-Instruct
samples one step's batch (``benchmarks.real_e2e``'s setup: 8 prompts x 8 completions of at most
16 tokens for ``short``, T = 1, no top-k/top-p) with transformers ``generate``, each
completion is scored by ``apps.arith.task:correct``, and both trainers compute their gradient
and take one optimizer step on exactly those tokens from the same weights:

- TRL 1.16: its own ``GRPOTrainer._compute_loss`` (loss ``dapo``, the default) on the inputs
  its generation step would build (prompts left-padded, completions cut after the first EOS),
  advantages by its formula (``(r - group mean) / (sample std + 1e-4)``,
  ``GRPOTrainer._generate_and_score_completions``), then AdamW as its ``create_optimizer``
  builds it, after grad-norm clipping at 1.0.
- Forge: ``TrainerCore`` as the main job configures it (``grpo`` loss, ``token_mean``, the
  generator's logprobs as pi_old, rows with advantage 0 skipped, shared prompts once), on
  ``Episode`` s carrying the sampler's logprobs, with advantages from
  ``forge.losses.grpo_advantages`` (population std) and, as a control, with TRL's.

Reported per seed: the cosine between the two gradients, their norm ratio, and the cosine and
sign agreement of the two weight updates. The last line is machine-readable:
``same_update_grad_cos=<min over seeds> same_update_step_cos=<min>``.
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.e2e import cpu_grpo_config
from benchmarks.real_e2e import SETUPS, Setup


def sample_batch(model, tok, setup: Setup, seed: int) -> dict:
    """One step's prompts, completions (cut after the first EOS, EOS kept), the sampler's
    per-token logprobs and rewards."""
    from apps.arith.task import correct

    rows = setup.rows(setup.prompts, seed=seed)
    torch.manual_seed(seed)
    eos = tok.eos_token_id
    prompts, completions, logps, rewards = [], [], [], []
    for row in rows:
        text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=setup.max_tokens,
                num_return_sequences=setup.group,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=eos,
            )
        lp_all = torch.stack(out.logits, 1).float().log_softmax(-1)  # [G, T, V]
        for g in range(setup.group):
            seq = out.sequences[g, len(ids) :].tolist()
            cut = seq.index(eos) + 1 if eos in seq else len(seq)
            seq = seq[:cut]
            lp = lp_all[g, torch.arange(cut), torch.tensor(seq)].tolist()
            text = tok.decode(seq, skip_special_tokens=True)
            prompts.append(ids)
            completions.append(seq)
            logps.append(lp)
            rewards.append(correct(row["prompt"], text, row["target"]))
    return {
        "prompts": prompts,
        "completions": completions,
        "logps": logps,
        "rewards": torch.tensor(rewards),
    }


def trl_advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """TRL 1.16's ``scale_rewards="group"`` advantages, ``(r - mean) / (sample std + 1e-4)``:
    Forge's ``grpo_advantages`` with TRL's std and eps."""
    from forge.losses import grpo_advantages

    return grpo_advantages(rewards, group, eps=1e-4, unbiased=True)


def trl_update(model_path: str, setup: Setup, batch: dict, out_dir: str) -> tuple[list, list]:
    """TRL's gradient and its first AdamW step's weight change, per parameter."""
    from datasets import Dataset
    from trl import GRPOTrainer

    args = cpu_grpo_config(
        out_dir,
        prompts=setup.prompts,
        group=setup.group,
        max_tokens=setup.max_tokens,
        lr=1e-5,
        steps=1,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=lambda **kw: [0.0],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "x"}]),
    )
    tok = trainer.processing_class
    pad = tok.pad_token_id
    width_p = max(len(p) for p in batch["prompts"])
    width_c = max(len(c) for c in batch["completions"])
    prompt_ids = torch.tensor([[pad] * (width_p - len(p)) + p for p in batch["prompts"]])
    prompt_mask = torch.tensor([[0] * (width_p - len(p)) + [1] * len(p) for p in batch["prompts"]])
    completion_ids = torch.tensor([c + [pad] * (width_c - len(c)) for c in batch["completions"]])
    completion_mask = torch.tensor(
        [[1] * len(c) + [0] * (width_c - len(c)) for c in batch["completions"]]
    )
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": trl_advantages(batch["rewards"], setup.group),
        "num_items_in_batch": completion_mask.sum(),
    }
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [p.grad.detach().clone() for p in params]
    before = [p.detach().clone() for p in params]
    trainer.create_optimizer()
    torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
    trainer.optimizer.step()
    steps = [p.detach() - b for p, b in zip(params, before)]
    return grads, steps


def forge_update(model_path: str, batch: dict, advantages: torch.Tensor) -> tuple[list, list]:
    """Forge's gradient (before clipping) and its first step's weight change, per parameter."""
    from forge.losses import LossConfig
    from forge.replay import collate_episodes
    from forge.training.trainer_config import OptimizerConfig, TrainerConfig
    from forge.training.trainer_core import TrainerCore
    from forge.types import Episode

    core = TrainerCore(
        TrainerConfig(
            model=model_path,
            device="cpu",
            loss=LossConfig(type="grpo"),
            optimizer=OptimizerConfig(lr=1e-5, max_grad_norm=1.0),
        )
    )
    eps = [
        Episode(
            episode_id=f"e{i}",
            prompt_ids=p,
            response_ids=c,
            behavior_logprobs=lp,
            reward=float(r),
            policy_version=0,
            advantage=float(a),
        )
        for i, (p, c, lp, r, a) in enumerate(
            zip(
                batch["prompts"], batch["completions"], batch["logps"], batch["rewards"], advantages
            )
        )
    ]
    params = [p for p in core.model.parameters() if p.requires_grad]
    denom = core.accumulate(collate_episodes(eps))
    grads = [torch.zeros_like(p) if p.grad is None else p.grad / max(denom, 1.0) for p in params]
    before = [p.detach().clone() for p in params]
    core.apply_accumulated()
    steps = [p.detach() - b for p, b in zip(params, before)]
    return grads, steps


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict[str, float]:
    """Cosine, norm ratio (a/b) and sign agreement of two flattened parameter lists."""
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    na = math.sqrt(sum(float(x.double().pow(2).sum()) for x in a))
    nb = math.sqrt(sum(float(y.double().pow(2).sum()) for y in b))
    moved = sum(int(((x != 0) | (y != 0)).sum()) for x, y in zip(a, b))
    agree = sum(int(((x.sign() == y.sign()) & ((x != 0) | (y != 0))).sum()) for x, y in zip(a, b))
    return {
        "cos": dot / max(na * nb, 1e-30),
        "ratio": na / max(nb, 1e-30),
        "sign_agree": agree / max(moved, 1),
    }


def main() -> None:
    import tempfile

    from transformers import AutoModelForCausalLM

    from forge.losses import grpo_advantages
    from forge.models import load_tokenizer
    from forge.models.gguf import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(SETUPS), default="short")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    torch.set_num_threads(2)
    setup = SETUPS[args.config]
    path = str(resolve_model("smollm2-135m-instruct"))
    tok = load_tokenizer(path)
    sampler = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    worst_g, worst_s = 1.0, 1.0
    for seed in args.seeds:
        batch = sample_batch(sampler, tok, setup, seed)
        r = batch["rewards"].view(-1, setup.group)
        live = int((r.max(1).values > r.min(1).values).sum())
        if not live:
            print(
                f"[same_update] seed {seed}: no group with a reward spread (every advantage 0,"
                " both gradients 0): skipped",
                flush=True,
            )
            continue
        with tempfile.TemporaryDirectory(prefix="forge-same-update-") as tmp:
            g_trl, s_trl = trl_update(path, setup, batch, tmp)
        g_f, s_f = forge_update(path, batch, grpo_advantages(batch["rewards"], setup.group))
        g_c, s_c = forge_update(path, batch, trl_advantages(batch["rewards"], setup.group))
        grad, step = compare(g_f, g_trl), compare(s_f, s_trl)
        grad_c, step_c = compare(g_c, g_trl), compare(s_c, s_trl)
        tokens = sum(len(c) for c in batch["completions"])
        print(
            f"[same_update] seed {seed}: {len(batch['completions'])} rows, {tokens} tokens, "
            f"mean reward {float(batch['rewards'].mean()):.3f}, {live}/{setup.prompts} groups "
            f"with a reward spread",
            flush=True,
        )
        for name, g, s in (
            ("forge (population std)", grad, step),
            ("forge with TRL's advantages", grad_c, step_c),
        ):
            print(
                f"  {name:28s} gradient cos {g['cos']:.6f}, norm ratio {g['ratio']:.4f}; "
                f"update cos {s['cos']:.6f}, signs agree {100 * s['sign_agree']:.3f}%",
                flush=True,
            )
        worst_g, worst_s = min(worst_g, grad["cos"]), min(worst_s, step["cos"])
    print(f"same_update_grad_cos={worst_g:.6f} same_update_step_cos={worst_s:.6f}")


if __name__ == "__main__":
    main()
