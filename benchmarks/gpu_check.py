"""GPU check (issue 35): GRPO on one GPU with the hf engine in bf16, time-sliced (colocated)
and then split by memory, on a model of Qwen2-0.5B's shapes with random weights.

    bash scripts/gpu_check.sh                     # a GPU machine, no network, < 8 minutes
    python -m benchmarks.gpu_check --cpu-smoke    # a tiny model on CPU (tests/checks runs it)

It needs torch, transformers and what they and peft pull in (a GPU machine lent to this
project may have nothing else: no vLLM, no hub access), so it drives Forge's plain modules
rather than the actor runtime: the generation engine (``forge.generation.hf_engine``), sleep
(``forge.generation.sleep``), GRPO advantages and loss (``forge.losses``), memory snapshots
and optimizer offload (``forge.observability.memory``). A run adds the actors, the weight
transport and the rollout machinery around these.

Each step: generate ``--prompts`` x ``--group`` completions of ``--tokens`` tokens (EOS
ignored, so every step decodes as many), score them (a fixed function of the tokens: the
figures are about speed and memory, not learning), one GRPO update, hand the weights over.

- ``colocate`` (one process): generate; sleep the generator (its KV cache and weights
  freed); bring the optimizer state back from host memory; train; hand over (storage again,
  then a device-to-device copy); offload the optimizer state and free the gradients; wake.
- ``split`` (two processes, as a run places them): the generator in a process of its own
  capped at ``--generator-share`` of the GPU's memory, the trainer in this one capped at
  ``--trainer-share``; both stay resident; the weights go over as CUDA IPC handles
  (``torch.multiprocessing``; shared memory on CPU) and are copied into the generator's model.

Reported per mode: s/step, tokens/s of generation and training, peak GPU memory per phase,
hand-off time, the trainer-vs-generator logprob mismatch (``mismatch_kl``, ``logprob_gap``,
as ``forge.training.hf_trainer.mismatch_metrics``), and whether the memory after each cycle
returns to its level after the first. With 2 or more GPUs, also the NCCL broadcast of the
weights between two processes. The last line is JSON. Without a GPU (and without
``--cpu-smoke``) it stops at once with an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

# Qwen2-0.5B's shapes (config.json of Qwen/Qwen2-0.5B), random weights.
QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
SMOKE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
MB = 2**20


def build_model(shapes: dict, dtype: torch.dtype, device: str, seed: int = 0):
    """A Qwen2 causal LM of ``shapes`` with random weights, built locally (no hub)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        **shapes,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
        attn_implementation="sdpa" if device != "cpu" else "eager",
    )
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype)


def sync() -> float:
    """Wait for the GPU's queued work; the time after it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def snap() -> dict[str, float]:
    """This process's memory (``forge.observability.memory``; resets the GPU peak)."""
    from forge.observability.memory import memory_snapshot

    return memory_snapshot()


class GeneratorSide:
    """The generator's model and engine; ``sleep``/``load`` as a colocated run does them."""

    def __init__(self, args, tokenizer_dir: str) -> None:
        from forge.generation.hf_engine import HFEngine
        from forge.models import load_tokenizer

        self.args = args
        self.model = build_model(args.shapes, getattr(torch, args.dtype), args.device).eval()
        tokenizer = load_tokenizer(tokenizer_dir)
        self.engine = HFEngine(self.model, tokenizer, max_batch_size=args.prompts * args.group)
        self.dropped = None

    def generate(self, i: int) -> tuple[list, float, float]:
        """(completions, seconds, peak GPU MiB) of step ``i``'s requests."""
        from forge.types import SamplingParams

        a = self.args
        params = SamplingParams(
            n=a.group, max_tokens=a.tokens, temperature=1.0, ignore_eos=True, seed=i
        )
        prompts = [[5 + (7 * i + j) % 200] * 16 for j in range(a.prompts)]  # token-id prompts
        t = sync()
        snap()
        out = self.engine.generate([(p, params) for p in prompts])
        return out, sync() - t, snap().get("gpu_peak_mb", 0.0)

    def sleep(self) -> None:
        """Free the KV cache (the kept prefixes: nothing runs) and the weights."""
        from forge.generation.sleep import drop_weights
        from forge.observability.memory import release_cached_memory

        self.engine.clear_prefix_cache()
        self.dropped = drop_weights(self.model)
        release_cached_memory()

    @torch.no_grad()
    def load(self, state_dict: dict[str, torch.Tensor], version: int) -> float:
        """Storage again if asleep, then copy ``state_dict`` in (on the device); seconds."""
        from forge.generation.sleep import materialize_weights

        t = sync()
        if self.dropped is not None:
            materialize_weights(self.model, self.dropped)
            self.dropped = None
        for name, dst in self.model.state_dict().items():
            dst.copy_(state_dict[name])
        self.engine.version = version
        return sync() - t


class TrainerSide:
    """The trainer's model, AdamW and the GRPO loss."""

    def __init__(self, args) -> None:
        from forge.losses import LossConfig, build_loss

        self.args, self.device = args, args.device
        self.model = build_model(args.shapes, getattr(torch, args.dtype), args.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-6)
        self.loss_fn = build_loss(LossConfig(type="grpo"))
        self.offloaded: dict = {}

    def update(self, groups) -> dict[str, float]:
        """One GRPO step on the generated groups; loss, tokens and the logprob mismatch."""
        from forge.losses import grpo_advantages
        from forge.models.logprobs import token_logprobs
        from forge.replay.collate import collate_episodes
        from forge.types import Episode

        episodes = []
        for g, completions in enumerate(groups):
            for k, c in enumerate(completions):  # a fixed score of the tokens: odd ids' share
                reward = sum(t % 2 for t in c.token_ids) / max(len(c.token_ids), 1)
                episodes.append(
                    Episode(
                        f"{g}-{k}",
                        c.prompt_ids,
                        c.token_ids,
                        c.logprobs,
                        reward,
                        0,
                        group_id=str(g),
                    )
                )
        rewards = torch.tensor([e.reward for e in episodes])
        for e, adv in zip(episodes, grpo_advantages(rewards, self.args.group).tolist()):
            e.advantage = adv
        b = collate_episodes(episodes, pad_id=0)
        ids, attn = b.input_ids_bt.to(self.device), b.attention_mask_bt.to(self.device)
        mask, gen = b.response_mask_bt.to(self.device), b.behavior_logprobs_bt.to(self.device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        lp = token_logprobs(self.model, ids, attn)
        loss, _ = self.loss_fn(
            logprobs_bt=lp,
            generator_logprobs_bt=gen,
            advantages_b=b.advantages_b.to(self.device),
            mask_bt=mask,
        )
        loss.backward()
        self.optimizer.step()
        return {
            "loss": float(loss.detach()),
            "tokens": float(mask.sum()),
            **mismatch(lp.detach(), gen, mask),
        }

    def offload(self, to_host: bool) -> None:
        """Optimizer state (and gradients) off the device while generating, or back."""
        from forge.observability.memory import move_optimizer_state, release_cached_memory

        if to_host:
            self.optimizer.zero_grad(set_to_none=True)
            _, self.offloaded = move_optimizer_state(self.optimizer, "cpu")
            release_cached_memory()
        else:
            move_optimizer_state(self.optimizer, None, self.offloaded)


def mismatch(lp_bt: torch.Tensor, gen_bt: torch.Tensor, mask_bt: torch.Tensor) -> dict:
    """``forge.training.hf_trainer.mismatch_metrics`` (that module imports the actor runtime)."""
    n = mask_bt.sum().clamp(min=1.0)
    d_bt = (lp_bt - gen_bt).clamp(-20.0, 20.0) * mask_bt
    return {
        "logprob_gap": float(d_bt.abs().sum() / n),
        "mismatch_kl": float(((torch.expm1(d_bt) - d_bt) * mask_bt).sum() / n),
    }


def colocated(args, tokenizer_dir: str) -> list[dict]:
    """Both roles in this process, taking turns on the device."""
    gen, trainer = GeneratorSide(args, tokenizer_dir), TrainerSide(args)
    gen.load(trainer.model.state_dict(), 0)
    rows = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        groups, gen_s, gen_peak = gen.generate(i)
        t = sync()
        gen.sleep()
        trainer.offload(to_host=False)
        row = {"generate_s": gen_s, "generate_peak_mb": gen_peak, "sleep_s": sync() - t}
        row["asleep_allocated_mb"] = snap().get("gpu_allocated_mb", 0.0)
        t = sync()
        row.update(trainer.update(groups))
        row["train_s"], row["train_peak_mb"] = sync() - t, snap().get("gpu_peak_mb", 0.0)
        row["handoff_s"] = gen.load(trainer.model.state_dict(), i + 1)
        row["handoff_peak_mb"] = snap().get("gpu_peak_mb", 0.0)
        trainer.offload(to_host=True)  # the generator wakes: nothing else to do in-process
        rows.append(_finish(args, row, t0, snap()))
    return rows


def split(args, tokenizer_dir: str) -> list[dict]:
    """The generator in a process of its own, each role capped at its share."""
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_generator_process, args=(args, tokenizer_dir, inbox, outbox))
    child.start()
    try:
        if args.device == "cuda":
            torch.cuda.set_per_process_memory_fraction(args.trainer_share)
        trainer = TrainerSide(args)
        _ask(inbox, outbox, "weights", _shareable(trainer.model), 0)
        rows = []
        for i in range(args.steps):
            t0 = time.perf_counter()
            groups, gen_s, gen_peak = _ask(inbox, outbox, "generate", i)
            row = {
                "generate_s": gen_s,
                "generate_peak_mb": gen_peak,
                "sleep_s": 0.0,
                "asleep_allocated_mb": 0.0,
            }
            t = sync()
            row.update(trainer.update(groups))
            row["train_s"], row["train_peak_mb"] = sync() - t, snap().get("gpu_peak_mb", 0.0)
            t = sync()
            _, gen_mem = _ask(inbox, outbox, "weights", _shareable(trainer.model), i + 1)
            row["handoff_s"], row["handoff_peak_mb"] = sync() - t, gen_mem.get("gpu_peak_mb", 0.0)
            mem = snap()  # both processes: the device holds the sum
            for key in ("gpu_allocated_mb", "rss_mb"):
                mem[key] = mem.get(key, 0.0) + gen_mem.get(key, 0.0)
            rows.append(_finish(args, row, t0, mem))
        inbox.put(("stop",))
        child.join(60)
        return rows
    finally:
        if child.is_alive():
            child.kill()
            child.join()


def _shareable(model) -> dict[str, torch.Tensor]:
    # Detached views: sent over a queue they become CUDA IPC handles (shared memory on CPU).
    return {k: v.detach() for k, v in model.state_dict().items()}


def _ask(inbox, outbox, *msg):
    inbox.put(msg)
    reply = outbox.get(timeout=600)
    if isinstance(reply, BaseException):
        raise RuntimeError("the generator process failed") from reply
    return reply


def _generator_process(args, tokenizer_dir: str, inbox, outbox) -> None:
    try:
        if args.device == "cuda":
            torch.cuda.set_per_process_memory_fraction(args.generator_share)
        gen = GeneratorSide(args, tokenizer_dir)
        while (msg := inbox.get())[0] != "stop":
            if msg[0] == "generate":
                outbox.put(gen.generate(msg[1]))
            else:  # "weights": the trainer's tensors, read in place, copied into ours
                seconds = gen.load(msg[1], msg[2])
                del msg
                outbox.put((seconds, snap()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        outbox.put(RuntimeError(f"{type(e).__name__}: {e}"))


def _finish(args, row: dict, t0: float, mem: dict) -> dict:
    a = args
    row["after_cycle_allocated_mb"] = mem.get("gpu_allocated_mb", 0.0)
    row["after_cycle_rss_mb"] = mem["rss_mb"]
    row["generate_tokens_per_s"] = a.prompts * a.group * a.tokens / row["generate_s"]
    row["train_tokens_per_s"] = row.pop("tokens") / row["train_s"]
    row["step_s"] = time.perf_counter() - t0
    return row


def summarize(mode: str, rows: list[dict], model_mb: float) -> dict:
    """Means over the steps after the first (warm-up); peaks over all; memory return."""
    warm = rows[1:] or rows
    mean = {k: sum(r[k] for r in warm) / len(warm) for k in warm[0]}
    peaks = {k: max(r[k] for r in rows) for k in rows[0] if k.endswith("_peak_mb")}
    after = [r["after_cycle_allocated_mb"] for r in rows]
    growth = max(after[1:], default=after[0]) - after[0]
    return {
        "mode": mode,
        **{k: float(f"{v:.6g}") for k, v in mean.items()},
        **peaks,
        "memory_growth_after_first_cycle_mb": round(growth, 2),
        "memory_returns": growth <= max(0.01 * model_mb, 1.0),
    }


def broadcast_check(args) -> dict | None:
    """The weights broadcast from GPU 0's process to GPU 1's over NCCL (with
    ``--cpu-smoke``: gloo between two CPU processes); ``None`` with one GPU."""
    if not args.smoke and torch.cuda.device_count() < 2:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/broadcast.json"
        mp.spawn(_broadcast_rank, args=(args, f"file://{tmp}/rendezvous", out), nprocs=2)
        with open(out) as f:
            return json.load(f)


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
            t = sync()
            broadcast_state_dict(sd if rank == 0 else None, 0, into=None if rank == 0 else sd)
            times.append(sync() - t)
        probe = next(iter(sd.values())).float().sum()
        probe_src = probe.clone()
        dist.broadcast(probe_src, 0)  # rank 0's checksum of the same tensor
        if rank == 1:
            nbytes = sum(t.numel() * t.element_size() for t in sd.values())
            result = {
                "backend": backend,
                "path": path,
                "seconds": min(times),
                "mb": nbytes / MB,
                "gb_per_s": nbytes / min(times) / 2**30,
                "matches_sender": bool(torch.equal(probe, probe_src)),
            }
            with open(out, "w") as f:
                json.dump(result, f)
        # Both ranks past their last operation before either tears down: without it, rank 0
        # closing its gloo pairs while rank 1 still received aborted rank 1 (about 1 run in 3).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cpu-smoke",
        dest="smoke",
        action="store_true",
        help="a tiny model on CPU, float32, 2 steps (the test that keeps this alive)",
    )
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--generator-share", type=float, default=0.3, help="split: its memory cap")
    p.add_argument("--trainer-share", type=float, default=0.6, help="split: its memory cap")
    args = p.parse_args(argv)
    if args.smoke:
        args.device, args.dtype, args.shapes = "cpu", "float32", SMOKE
        args.steps, args.prompts, args.group, args.tokens = 2, 2, 4, 8
    else:
        if not torch.cuda.is_available():
            sys.exit(
                "gpu_check: no GPU visible (torch.cuda.is_available() is False); run it on "
                "a GPU machine, or use --cpu-smoke for the CPU test of the script"
            )
        args.device, args.dtype, args.shapes = "cuda", "bfloat16", QWEN2_05B
    from forge.models import make_tiny_model

    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = {
        "device": device_name,
        "gpus": torch.cuda.device_count(),
        "model": args.shapes,
        "dtype": args.dtype,
        "modes": [],
    }
    print(
        f"[gpu_check] {device_name}: Qwen2 {args.shapes['num_hidden_layers']} layers, "
        f"hidden {args.shapes['hidden_size']}, {args.dtype}",
        flush=True,
    )
    n_params = sum(p.numel() for p in build_model(args.shapes, torch.bfloat16, "meta").parameters())
    model_mb = n_params * torch.tensor([], dtype=getattr(torch, args.dtype)).element_size() / MB
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = str(make_tiny_model(f"{tmp}/tok", preset="tiny"))  # byte-level, ids < 512
        for mode, run in (("colocate", colocated), ("split", split)):
            rows = run(args, tokenizer_dir)
            for i, row in enumerate(rows):
                print(
                    f"[gpu_check] {mode} step {i}: {row['step_s']:.2f} s, generate "
                    f"{row['generate_tokens_per_s']:.0f} tok/s, hand-off "
                    f"{row['handoff_s']:.3f} s, mismatch_kl {row['mismatch_kl']:.2e}",
                    flush=True,
                )
            report["modes"].append(summarize(mode, rows, model_mb))
            from forge.observability.memory import release_cached_memory

            release_cached_memory()
    report["broadcast"] = broadcast_check(args)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
