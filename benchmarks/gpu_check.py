"""GPU check (issue 35): GRPO on one GPU with the hf engine in bf16, time-sliced (colocated)
and then split by memory, on a model of Qwen2-0.5B's shapes with random weights.

    bash scripts/gpu_check.sh                     # a GPU machine, no network, < 8 minutes
    python -m benchmarks.gpu_check --cpu-smoke    # a tiny model on CPU (tests/checks runs it)

It needs torch, transformers and what they and peft pull in (a GPU machine lent to this
project may have nothing else: no vLLM, no hub access), so it drives Forge's plain modules
in one process rather than the actor runtime: the generation engine
(``forge.generation.hf_engine``), sleep (``forge.generation.sleep``), GRPO advantages and
loss (``forge.losses``), memory snapshots and optimizer offload
(``forge.observability.memory``). A run adds processes and the weight transport around these.

Each step: generate ``--prompts`` x ``--group`` completions of ``--tokens`` tokens (EOS
ignored, so every step decodes the same number), score them (a fixed function of the
tokens: the numbers are about speed and memory, not learning), one GRPO update, hand the
weights to the generator.

- ``colocate``: generate, sleep the generator (KV cache and weights freed), bring the
  optimizer state back, train, hand over (storage again, then a device-to-device copy),
  offload the optimizer state to host, wake.
- ``split``: both stay resident (in this one process one cap, ``--memory-share``, covers
  both; a run gives each role's process its own), no sleep, no offload.

Reported per mode: s/step, tokens/s of generation and training, peak GPU memory per phase,
hand-off time, the trainer-vs-generator logprob mismatch in bf16 (``mismatch_kl``,
``logprob_gap``, as ``forge.training.hf_trainer.mismatch_metrics``), and whether memory after
each cycle returns to its level after the first. With 2 or more GPUs, also the NCCL
broadcast of the weights between two processes (``forge.weights.dist``). The last line is
JSON. Without a GPU (and without ``--cpu-smoke``) it stops at once with an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch

# Qwen2-0.5B's shapes (config.json of Qwen/Qwen2-0.5B), random weights.
QWEN2_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                 max_position_embeddings=4096, tie_word_embeddings=True)  # fmt: skip
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=512,
             tie_word_embeddings=True)  # fmt: skip
MB = 2**20


def build_model(shapes: dict, dtype: torch.dtype, device: str, seed: int = 0):
    """A Qwen2 causal LM of ``shapes`` with random weights, built locally (no hub)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**shapes, bos_token_id=1, eos_token_id=1, pad_token_id=0,
                      attn_implementation="sdpa" if device != "cpu" else "eager")  # fmt: skip
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype)


def mismatch(lp_bt: torch.Tensor, gen_bt: torch.Tensor, mask_bt: torch.Tensor) -> dict:
    """``forge.training.hf_trainer.mismatch_metrics`` (that module imports the actor runtime)."""
    n = mask_bt.sum().clamp(min=1.0)
    d_bt = (lp_bt - gen_bt).clamp(-20.0, 20.0) * mask_bt
    return {"logprob_gap": float(d_bt.abs().sum() / n),
            "mismatch_kl": float(((torch.expm1(d_bt) - d_bt) * mask_bt).sum() / n)}  # fmt: skip


class Check:
    """One mode's run: a generator engine and a trainer model on one device."""

    def __init__(self, args, mode: str, tokenizer) -> None:
        from forge.generation.hf_engine import HFEngine
        from forge.losses import LossConfig, build_loss

        self.args, self.mode, self.device = args, mode, args.device
        dtype = getattr(torch, args.dtype)
        self.trainer = build_model(args.shapes, dtype, self.device)
        self.generator = build_model(args.shapes, dtype, self.device).eval()
        self.generator.load_state_dict(self.trainer.state_dict())
        self.optimizer = torch.optim.AdamW(self.trainer.parameters(), lr=1e-6)
        self.loss_fn = build_loss(LossConfig(type="grpo"))
        self.engine = HFEngine(self.generator, tokenizer, max_batch_size=args.prompts * args.group)
        self.tokenizer, self.offloaded, self.dropped = tokenizer, {}, None
        self.rows: list[dict] = []

    def step(self, i: int) -> dict:
        from forge.generation.sleep import drop_weights, materialize_weights
        from forge.observability.memory import (
            memory_snapshot,
            move_optimizer_state,
            release_cached_memory,
        )

        a, row, colo = self.args, {"step": i}, self.mode == "colocate"
        sync()
        memory_snapshot()  # resets the GPU peak: each phase's own peak below
        t0 = time.perf_counter()
        completions = self.generate(i)
        row["generate_s"] = sync() - t0
        row["generate_tokens_per_s"] = a.prompts * a.group * a.tokens / row["generate_s"]
        row["generate_peak_mb"] = memory_snapshot().get("gpu_peak_mb", 0.0)
        t = time.perf_counter()
        if colo:  # sleep: the KV cache (nothing runs, kept prefixes go) and the weights
            self.engine.clear_prefix_cache()
            self.dropped = drop_weights(self.generator)
            release_cached_memory()
            move_optimizer_state(self.optimizer, None, self.offloaded)
        row["sleep_s"] = sync() - t
        row["asleep_allocated_mb"] = memory_snapshot().get("gpu_allocated_mb", 0.0)
        t = time.perf_counter()
        row.update(self.train(completions))
        row["train_s"] = sync() - t
        row["train_tokens_per_s"] = row.pop("tokens") / row["train_s"]
        row["train_peak_mb"] = memory_snapshot().get("gpu_peak_mb", 0.0)
        t = time.perf_counter()
        if self.dropped is not None:
            materialize_weights(self.generator, self.dropped)
            self.dropped = None
        with torch.no_grad():  # on the device: no round trip through the host
            own = self.trainer.state_dict()
            for name, dst in self.generator.state_dict().items():
                dst.copy_(own[name])
        self.engine.version = i + 1
        row["handoff_s"] = sync() - t
        row["handoff_peak_mb"] = memory_snapshot().get("gpu_peak_mb", 0.0)
        if colo:  # wake: the optimizer state to host, the generator serves again
            _, self.offloaded = move_optimizer_state(self.optimizer, "cpu")
            release_cached_memory()
        snap = memory_snapshot()
        row["after_cycle_allocated_mb"] = snap.get("gpu_allocated_mb", 0.0)
        row["after_cycle_rss_mb"] = snap["rss_mb"]
        row["step_s"] = time.perf_counter() - t0
        self.rows.append(row)
        return row

    def generate(self, i: int):
        from forge.types import SamplingParams

        a = self.args
        params = SamplingParams(n=a.group, max_tokens=a.tokens, temperature=1.0,
                                ignore_eos=True, seed=i)  # fmt: skip
        prompts = [[5 + (7 * i + j) % 200] * 16 for j in range(a.prompts)]  # token-id prompts
        return self.engine.generate([(p, params) for p in prompts])

    def train(self, groups) -> dict:
        from forge.losses import grpo_advantages
        from forge.models.logprobs import token_logprobs
        from forge.replay.collate import collate_episodes
        from forge.types import Episode

        episodes = []
        for g, completions in enumerate(groups):
            for k, c in enumerate(completions):  # a fixed score of the tokens: odd ids' share
                reward = sum(t % 2 for t in c.token_ids) / max(len(c.token_ids), 1)
                episodes.append(Episode(f"{g}-{k}", c.prompt_ids, c.token_ids, c.logprobs,
                                        reward, 0, group_id=str(g)))  # fmt: skip
        rewards = torch.tensor([e.reward for e in episodes])
        for e, adv in zip(episodes, grpo_advantages(rewards, self.args.group).tolist()):
            e.advantage = adv
        b = collate_episodes(episodes, pad_id=0)
        ids, attn = b.input_ids_bt.to(self.device), b.attention_mask_bt.to(self.device)
        mask, gen = b.response_mask_bt.to(self.device), b.behavior_logprobs_bt.to(self.device)
        self.trainer.train()
        self.optimizer.zero_grad(set_to_none=True)
        lp = token_logprobs(self.trainer, ids, attn)
        loss, _ = self.loss_fn(logprobs_bt=lp, generator_logprobs_bt=gen,
                               advantages_b=b.advantages_b.to(self.device), mask_bt=mask)  # fmt: skip
        loss.backward()
        self.optimizer.step()
        return {
            "loss": float(loss),
            "tokens": float(attn.sum()),
            **mismatch(lp.detach(), gen, mask),
        }


def sync() -> float:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def summarize(mode: str, rows: list[dict], model_mb: float) -> dict:
    """Means over the steps after the first (warm-up); peaks over all; memory return."""
    warm = rows[1:] or rows
    mean = {k: sum(r[k] for r in warm) / len(warm) for k in warm[0] if k != "step"}
    peaks = {k: max(r[k] for r in rows) for k in rows[0] if k.endswith("_peak_mb")}
    after = [r["after_cycle_allocated_mb"] for r in rows]
    growth = max(after[1:], default=after[0]) - after[0]
    return {"mode": mode, **{k: round(v, 4) for k, v in mean.items()}, **peaks,
            "memory_growth_after_first_cycle_mb": round(growth, 2),
            "memory_returns": growth <= max(0.01 * model_mb, 1.0)}  # fmt: skip


def broadcast_check(args) -> dict | None:
    """NCCL broadcast of the weights from GPU 0's process to GPU 1's (``forge.weights.dist``);
    with ``--cpu-smoke``, gloo between two CPU processes. ``None`` with one GPU."""
    if not args.smoke and torch.cuda.device_count() < 2:
        return None
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/broadcast.json"
        mp.spawn(_broadcast_rank, args=(args, f"file://{tmp}/rendezvous", out), nprocs=2)
        with open(out) as f:
            return json.load(f)


def _broadcast_rank(rank: int, args, init: str, out: str) -> None:
    import torch.distributed as dist

    broadcast_state_dict, path = _broadcast_fn()
    backend = "gloo" if args.smoke else "nccl"
    device = "cpu" if args.smoke else f"cuda:{rank}"
    if not args.smoke:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=2)
    try:
        model = build_model(args.shapes, getattr(torch, args.dtype), device, seed=rank)
        sd = model.state_dict()
        times = []
        for _ in range(3):
            sync()
            t = time.perf_counter()
            broadcast_state_dict(sd if rank == 0 else None, 0, into=None if rank == 0 else sd)
            times.append(sync() - t)
        probe = next(iter(sd.values())).float().sum()
        probe_src = probe.clone()
        dist.broadcast(probe_src, 0)  # rank 0's checksum of the same tensor
        if rank == 1:
            nbytes = sum(t.numel() * t.element_size() for t in sd.values())
            result = {"backend": backend, "path": path, "seconds": min(times), "mb": nbytes / MB,
                      "gb_per_s": nbytes / min(times) / 2**30,
                      "matches_sender": bool(torch.equal(probe, probe_src))}  # fmt: skip
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


def _broadcast_fn():
    """Forge's bucketed broadcast (``forge.weights.dist``, what ``weights: {type: broadcast}``
    runs), or, where ``forge.weights`` cannot load (it imports the actor runtime, whose
    packages a bare GPU machine lacks), one ``torch.distributed.broadcast`` per tensor."""
    try:
        from forge.weights.dist import broadcast_state_dict

        return broadcast_state_dict, "forge.weights.dist"
    except ImportError as e:
        import torch.distributed as dist

        def per_tensor(sd, src, into=None):
            for t in (sd if sd is not None else into).values():
                dist.broadcast(t, src)
            return sd if sd is not None else into

        return per_tensor, f"torch.distributed per tensor (forge.weights: {e})"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", dest="smoke", action="store_true",
                   help="a tiny model on CPU, float32, 2 steps (the test that keeps this alive)")  # fmt: skip
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--memory-share", type=float, default=0.9, help="split mode's cap")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.dtype, args.shapes = "cpu", "float32", SMOKE
        args.steps, args.prompts, args.group, args.tokens = 2, 2, 4, 8
    else:
        if not torch.cuda.is_available():
            sys.exit("gpu_check: no GPU visible (torch.cuda.is_available() is False); run it on "
                     "a GPU machine, or use --cpu-smoke for the CPU test of the script")  # fmt: skip
        args.device, args.dtype, args.shapes = "cuda", "bfloat16", QWEN2_05B
    from forge.models import load_tokenizer, make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:  # a byte-level tokenizer (ids < 512)
        tokenizer = load_tokenizer(str(make_tiny_model(f"{tmp}/tok", preset="tiny")))
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = {"device": device_name, "gpus": torch.cuda.device_count(), "model": args.shapes,
              "dtype": args.dtype, "modes": []}  # fmt: skip
    print(f"[gpu_check] {device_name}: Qwen2 {args.shapes['num_hidden_layers']} layers, "
          f"hidden {args.shapes['hidden_size']}, {args.dtype}", flush=True)  # fmt: skip
    for mode in ("colocate", "split"):
        if args.device == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0 if mode == "colocate" else
                                                       args.memory_share)  # fmt: skip
        check = Check(args, mode, tokenizer)
        model_mb = sum(t.numel() * t.element_size() for t in check.trainer.parameters()) / MB
        for i in range(args.steps):
            row = check.step(i)
            print(f"[gpu_check] {mode} step {i}: {row['step_s']:.2f} s, generate "
                  f"{row['generate_tokens_per_s']:.0f} tok/s, hand-off {row['handoff_s']:.3f} s, "
                  f"mismatch_kl {row['mismatch_kl']:.2e}", flush=True)  # fmt: skip
        report["modes"].append(summarize(mode, check.rows, model_mb))
        del check
        from forge.observability.memory import release_cached_memory

        release_cached_memory()
    report["broadcast"] = broadcast_check(args)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
