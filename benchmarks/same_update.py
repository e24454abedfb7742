"""One batch, two trainers: Forge's GRPO update against TRL's GRPOTrainer on the same samples.

    pip install 'trl==1.16.*'
    python -m benchmarks.same_update [--config short|gen-heavy] [--seeds 0 1 2]
        [--cases all|on-policy|off-policy] [--earlier-updates 2] [--earlier-lr 1e-5]

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

Off-policy cases (``--earlier-updates N``, default 2): Forge first takes N float32 steps on
the same batch (PPO's epochs over one batch), and from those weights both trainers take the
compared step with the *sampler's* logprobs as pi_old (TRL: ``old_per_token_logps``, as its
``num_iterations > 1`` path computes them), so ratios move away from 1 and some tokens fall
outside the 0.2 clip band; both use TRL's advantages. Twice: in float32, and at the main job's
precision on a CPU with native bf16 (Forge: ``autocast: bfloat16`` with ``autocast_head``;
TRL: ``GRPOConfig(bf16=True)``, the forward wrapped by accelerate as ``Trainer.train`` wraps
it; float32 weights and AdamW on both).

Reported per seed and case: both losses, the gradients' cosine and norm ratio, and for the
weight updates their cosine, the largest elementwise difference (absolute, and over the
largest element of TRL's update), the norm of the difference over TRL's, the sign agreement,
and Forge's mean ratio and clipped share of trained tokens. The last line is
machine-readable: ``same_update_step_cos[<case>]=<min over seeds>``.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

import torch

from benchmarks.e2e import cpu_grpo_config
from benchmarks.real_e2e import SETUPS, Setup

if TYPE_CHECKING:
    from forge.training.trainer_core import TrainerCore


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


def trl_update(
    model_path: str,
    setup: Setup,
    batch: dict,
    out_dir: str,
    *,
    old_logprobs: bool = False,
    bf16: bool = False,
) -> tuple[list, list, float]:
    """TRL's gradient, its first AdamW step's weight change (per parameter) and its loss.

    ``old_logprobs``: the batch's sampler logprobs go in as TRL's ``old_per_token_logps``
    (the ratio's denominator, as TRL computes it when ``num_iterations > 1``); without them
    TRL takes its own detached logprobs (ratio exactly 1). ``bf16``: ``GRPOConfig(bf16=True)``,
    the model's forward wrapped by accelerate's ``prepare_model`` as ``Trainer.train`` wraps
    it (bf16 autocast, outputs upcast to float32; float32 weights and AdamW)."""
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
        bf16=bf16,
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
    if old_logprobs:
        inputs["old_per_token_logps"] = torch.tensor(
            [lp + [0.0] * (width_c - len(lp)) for lp in batch["logps"]]
        )
    model = trainer.model
    if bf16:
        model = trainer.accelerator.prepare_model(model)
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
    return grads, steps, float(loss.detach())


def forge_update(
    model_path: str, batch: dict, advantages: torch.Tensor, *, bf16: bool = False, lr: float = 1e-5
) -> tuple[list, list, dict, TrainerCore]:
    """Forge's gradient (before clipping), its first step's weight change (per parameter), the
    step's metrics and the trainer. ``bf16``: the main job's precision on a CPU with native
    bf16 (``autocast: bfloat16`` with ``autocast_head``: float32 weights and AdamW, bf16
    matmuls and LM head)."""
    from forge.losses import LossConfig
    from forge.training.trainer_config import OptimizerConfig, TrainerConfig
    from forge.training.trainer_core import TrainerCore

    core = TrainerCore(
        TrainerConfig(
            model=model_path,
            device="cpu",
            loss=LossConfig(type="grpo"),
            optimizer=OptimizerConfig(lr=lr, max_grad_norm=1.0),
            autocast="bfloat16" if bf16 else None,
            autocast_head=bf16,
        )
    )
    params = [p for p in core.model.parameters() if p.requires_grad]
    denom = core.accumulate(collate(batch, advantages))
    grads = [torch.zeros_like(p) if p.grad is None else p.grad / max(denom, 1.0) for p in params]
    before = [p.detach().clone() for p in params]
    metrics = core.apply_accumulated()
    steps = [p.detach() - b for p, b in zip(params, before)]
    return grads, steps, metrics, core


def collate(batch: dict, advantages: torch.Tensor):
    """The batch as Forge's ``TrainBatch``: ``Episode`` s carrying the sampler's logprobs."""
    from forge.replay import collate_episodes
    from forge.types import Episode

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
    return collate_episodes(eps)


def earlier_weights(
    model_path: str, batch: dict, advantages: torch.Tensor, updates: int, lr: float, out_dir: str
) -> str:
    """The weights after ``updates`` float32 Forge steps on ``batch`` (PPO's epochs over one
    batch: each moves the ratios to the sampler away from 1, towards the clip band), saved as
    a transformers checkpoint in ``out_dir`` (with the tokenizer); returns ``out_dir``."""
    from transformers import AutoModelForCausalLM

    from forge.models import load_tokenizer

    *_, core = forge_update(model_path, batch, advantages, lr=lr)
    for _ in range(updates - 1):
        core.accumulate(collate(batch, advantages))
        core.apply_accumulated()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(core.hf_state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"earlier_weights: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(out_dir)
    load_tokenizer(model_path).save_pretrained(out_dir)
    return out_dir


def compare(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict[str, float]:
    """Cosine, norm ratio (a/b), sign agreement and the largest elementwise difference of two
    flattened parameter lists: ``max_abs`` = max |a - b|, ``max_rel`` = that over max |b|,
    ``rel_norm`` = ||a - b|| / ||b||."""
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    na = math.sqrt(sum(float(x.double().pow(2).sum()) for x in a))
    nb = math.sqrt(sum(float(y.double().pow(2).sum()) for y in b))
    moved = sum(int(((x != 0) | (y != 0)).sum()) for x, y in zip(a, b))
    agree = sum(int(((x.sign() == y.sign()) & ((x != 0) | (y != 0))).sum()) for x, y in zip(a, b))
    max_abs = max(float((x - y).abs().max()) for x, y in zip(a, b))
    max_b = max(float(y.abs().max()) for y in b)
    diff = math.sqrt(sum(float((x.double() - y.double()).pow(2).sum()) for x, y in zip(a, b)))
    return {
        "cos": dot / max(na * nb, 1e-30),
        "ratio": na / max(nb, 1e-30),
        "sign_agree": agree / max(moved, 1),
        "max_abs": max_abs,
        "max_rel": max_abs / max(max_b, 1e-30),
        "rel_norm": diff / max(nb, 1e-30),
    }


def report(name: str, forge: tuple, trl: tuple) -> dict[str, float]:
    """Print one case's line: losses, gradient and update agreement; returns the update's."""
    (g_f, s_f, metrics), (g_t, s_t, loss_t) = forge, trl
    g, st = compare(g_f, g_t), compare(s_f, s_t)
    print(
        f"  {name:30s} loss {metrics['policy_loss']:+.6f} / TRL {loss_t:+.6f}; gradient cos "
        f"{g['cos']:.6f}, norm ratio {g['ratio']:.4f}; update cos {st['cos']:.6f}, max |diff| "
        f"{st['max_abs']:.2e} ({st['max_rel']:.2e} of the largest), ||diff||/||TRL|| "
        f"{st['rel_norm']:.2e}, signs agree {100 * st['sign_agree']:.3f}%; ratio mean "
        f"{metrics.get('ratio_mean', float('nan')):.4f}, clipped "
        f"{100 * metrics.get('clip_fraction', float('nan')):.2f}% of trained tokens",
        flush=True,
    )
    return {"grad_cos": g["cos"], **st}


def main() -> None:
    import tempfile

    from transformers import AutoModelForCausalLM

    from forge.losses import grpo_advantages
    from forge.models import load_tokenizer
    from forge.models.gguf import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(SETUPS), default="short")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument(
        "--earlier-updates",
        type=int,
        default=2,
        help="off-policy cases: Forge steps on the batch before the compared one (0: none)",
    )
    ap.add_argument("--earlier-lr", type=float, default=1e-5)
    ap.add_argument(
        "--cases",
        choices=["all", "on-policy", "off-policy"],
        default="all",
        help="which comparisons to run per seed",
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    setup = SETUPS[args.config]
    path = str(resolve_model("smollm2-135m-instruct"))
    tok = load_tokenizer(path)
    sampler = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    worst: dict[str, float] = {}
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
        tokens = sum(len(c) for c in batch["completions"])
        print(
            f"[same_update] seed {seed}: {len(batch['completions'])} rows, {tokens} tokens, "
            f"mean reward {float(batch['rewards'].mean()):.3f}, {live}/{setup.prompts} groups "
            f"with a reward spread",
            flush=True,
        )
        adv_trl = trl_advantages(batch["rewards"], setup.group)
        cases = {}
        with tempfile.TemporaryDirectory(prefix="forge-same-update-") as tmp:
            if args.cases != "off-policy":
                trl = trl_update(path, setup, batch, tmp)
                for name, adv in (
                    (
                        "on-policy fp32, population std",
                        grpo_advantages(batch["rewards"], setup.group),
                    ),
                    ("on-policy fp32, TRL's advantages", adv_trl),
                ):
                    cases[name] = report(name, forge_update(path, batch, adv)[:3], trl)
            if args.cases != "on-policy" and args.earlier_updates:
                w = earlier_weights(
                    path, batch, adv_trl, args.earlier_updates, args.earlier_lr, f"{tmp}/w"
                )
                for bf16 in (False, True):
                    name = f"off-policy {'bf16 autocast' if bf16 else 'fp32'}, clip 0.2"
                    trl = trl_update(w, setup, batch, tmp, old_logprobs=True, bf16=bf16)
                    forge = forge_update(w, batch, adv_trl, bf16=bf16)[:3]
                    cases[name] = report(name, forge, trl)
        for name, c in cases.items():
            key = "on" if name.startswith("on-policy") else name.split(",")[0].replace(" ", "_")
            worst[key] = min(worst.get(key, 1.0), c["cos"])
    print(" ".join(f"same_update_step_cos[{k}]={v:.6f}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
