"""Weight sync benchmark: trainer push and generator pull of a ~100M-parameter model.

    python -m benchmarks.weights [--repeats 5] [--hidden 768] [--layers 12] [--vocab 32000]

Builds a randomly initialised fp32 Qwen2 model (hidden 768, 12 layers, vocab 32k: ~110M
parameters, ~0.44 GB; nothing is downloaded) in a temporary directory, starts a ``Trainer``
actor (1 process) and two ``Generator`` services of 2 replicas each (hf backend), then times,
side by side in one run and as medians over ``--repeats`` (after ``WARMUP_ROUNDS`` rounds that
fill the pusher's pool of recycled files and the pullers' kept mappings: the steady state of
a training run; the first, cold push and pull are printed too):

- **push**: ``trainer.push_weights.call_one(version)`` (the state dict into a recycled
  ``/dev/shm`` file, or a new one while the pool fills; the controller's round trip included);
- **pull, fanout**: ``gen.update_weights.fanout(handle=h)``: both replicas pull the version
  and swap it in (they run in parallel, so the time is per replica and for both);
- **pull, one replica**: ``gen.update_weights.route(handle=h)``: one replica alone;
  ``gen`` shares (``WeightTransportConfig.share``, the default: replicas compute with the pushed
  file in place, read-only, so a pull copies nothing);
- **copying**: the same two pulls on a second service with ``share=False`` (each replica
  copies the version into its own model: the path before sharing, and the one a GPU takes);
- **memcpy**: ``dst.copy_(src)`` of the same number of bytes (the bytes a version stores: tied
  weights once) into preallocated memory, in this process (the floor for moving them once);
- **breakdown**, redone in this process on a model of the same shape, each with its page-fault
  count: ``lease_shm_file(h)`` (a sharing replica's pull); ``pull_handle(h)`` into fresh
  tensors then ``load_in_place`` into the model (what a busy copying replica does); ``pull_handle(h, into=...)`` straight into the model's tensors
  (what an idle copying replica does); a ``SharedMemoryTransport`` push into a recycled file (what the
  trainer's push does in steady state) and ``write_shm_file`` into a new file (its first
  pushes); and, not Forge code paths, ``os.preadv`` of the file into the model's tensors and
  ``os.pwrite`` of the same layout into a new file (what read/write-based transfers cost).

The last line is machine-readable: ``sync_vs_memcpy=<ratio>`` (the sharing fanout's time, in
which both replicas pull, over the memcpy time) and ``copying_vs_memcpy=<ratio>`` (the same
for the copying service).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import time_sync
from controller import loops, shutdown

# Rounds (2 pushes each) before timing: keep_last=2 versions plus 1 spare file is 3 pushes
# until every push rewrites a recycled file and every pull reads through a kept mapping.
WARMUP_ROUNDS = 2


def build_model(out: Path, hidden: int, layers: int, vocab: int) -> int:
    """Write a random-init Qwen2 model (with the tiny model's tokenizer); return its params."""
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    from forge.models import make_tiny_model

    make_tiny_model(out, preset="tiny")  # tokenizer, generation config and special ids
    tiny = AutoConfig.from_pretrained(out)
    heads = max(1, hidden // 64)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=tiny.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tiny.pad_token_id,
        bos_token_id=tiny.bos_token_id,
        eos_token_id=tiny.eos_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).float()
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def gbps(nbytes: int, s: float) -> str:
    return f"{nbytes / s / 1e9:6.2f} GB/s"


async def bench_sync(model_dir: str, repeats: int) -> dict:
    from forge.actors.generator import Generator
    from forge.actors.trainer import Trainer
    from forge.generation import GeneratorConfig
    from forge.training.trainer_config import TrainerConfig
    from forge.weights import WeightTransportConfig

    t0 = time.perf_counter()
    trainer = await Trainer.options(procs=1).as_actor(TrainerConfig(model=model_dir, device="cpu"))
    gen = await Generator.options(num_replicas=2, procs=1).as_service(
        GeneratorConfig(model=model_dir, backend="hf")
    )
    # The same service copying every version into its replicas' own models (share=False).
    copying = await Generator.options(num_replicas=2, procs=1).as_service(
        GeneratorConfig(model=model_dir, backend="hf", weights=WeightTransportConfig(share=False))
    )
    startup = time.perf_counter() - t0
    push, fan, one, fan_copy, one_copy, cold = [], [], [], [], [], {}
    version, handle = 0, None
    try:
        for i in range(repeats + WARMUP_ROUNDS):
            for pull, timings in (
                (gen.update_weights.fanout, fan),
                (gen.update_weights.route, one),
                (copying.update_weights.fanout, fan_copy),
                (copying.update_weights.route, one_copy),
            ):
                version += 1
                t = time.perf_counter()
                handle = await trainer.push_weights.call_one(version)
                t_push = time.perf_counter() - t
                t = time.perf_counter()
                await pull(handle=handle)
                t_pull = time.perf_counter() - t
                # Untimed: every replica of both services on this version (no-op where it
                # already is), as a run's fanout leaves them: a sharing replica only holds
                # the version it computes with, so the trainer's files keep rotating.
                await gen.update_weights.fanout(handle=handle)
                await copying.update_weights.fanout(handle=handle)
                cold.setdefault("push", t_push)
                cold.setdefault("pull", t_pull)
                if i >= WARMUP_ROUNDS:
                    push.append(t_push)
                    timings.append(t_pull)
        checks = set(await gen.state_dict_checksum.fanout())
        checks |= set(await copying.state_dict_checksum.fanout())
        # Keep the last version alive for the in-process breakdown; close() drops it.
        return {
            "startup": startup,
            "push": push,
            "fanout": fan,
            "one": one,
            "fanout_copy": fan_copy,
            "one_copy": one_copy,
            "cold": cold,
            "handle": handle,
            "replicas_agree": len(checks) == 1,
            "trainer": trainer,
        }
    except BaseException:
        await trainer.close.call_one()
        raise


def bench_breakdown(model_dir: str, handle, repeats: int) -> dict:
    """Time the pieces of a replica's update_weights in this process, on the same bytes."""
    from forge.generation.hf_weights import load_in_place
    from forge.models import load_model
    from forge.weights import pull_handle

    model = load_model(model_dir, "float32", "cpu", "eager")
    # The first copy into a freshly loaded model faults its pages in; replicas pay that once.
    load_in_place(model, pull_handle(handle))
    own = {k: v.detach() for k, v in model.state_dict().items() if k in handle.manifest}
    recycled = _RecycledPush(own)
    steps = {
        "fresh": lambda: pull_handle(handle),
        "load_in_place": lambda: load_in_place(model, sd),
        # One copy straight into the model's tensors (what pull_handle's ``into`` is for).
        # The model's state_dict has tied aliases (lm_head.weight): keep the pushed names.
        "into": lambda: pull_handle(handle, into=own),
        # What a sharing replica's pull does: a lease on the file, views of its mapping.
        "lease": lambda: _lease(handle),
        # Not in Forge, for reference: read() the shm file straight into the model's
        # tensors, which skips the per-page faults of a fresh mapping.
        "preadv": lambda: _preadv_into(handle, own),
        # The push side, same bytes: what the trainer's push_weights does (a recycled file
        # rewritten; a new file while its pool fills), and for reference os.pwrite of the same
        # layout into a new file.
        "recycled": recycled.push,
        "push": lambda: _push_shm(own, "mmap"),
        "pwrite": lambda: _push_shm(own, "pwrite", handle),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}
    faults: dict[str, list[int]] = {k: [] for k in steps}
    sd = pull_handle(handle)
    for _ in range(repeats):
        for name, fn in steps.items():
            if name == "fresh":
                del sd  # free the previous pull first, as a replica does
            f0, t = _minor_faults(), time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t)
            faults[name].append(_minor_faults() - f0)
            if name == "fresh":
                sd = out
            del out
    recycled.close()
    med = statistics.median
    return {k: (med(times[k]), med(faults[k])) for k in steps}


class _RecycledPush:
    """Pushes through a ``SharedMemoryTransport`` with keep_last=2 retention, as the trainer's
    ``WeightStore`` does; warmed up so that every timed push rewrites a recycled file."""

    def __init__(self, state_dict: dict[str, torch.Tensor]) -> None:
        from forge.weights import SharedMemoryTransport, WeightStore

        transport = SharedMemoryTransport(f"bench-{os.getpid()}", spares=1)
        self.store, self.state_dict = WeightStore(transport, keep_last=2), state_dict
        self.versions = itertools.count(1)
        for _ in range(3):
            self.push()

    def push(self) -> None:
        self.store.push(self.state_dict, next(self.versions))

    def close(self) -> None:
        self.store.close()


def _push_shm(state_dict: dict[str, torch.Tensor], how: str, handle=None) -> None:
    from forge.weights.shm import write_shm_file

    path = f"/dev/shm/forge-bench-{os.getpid()}-{how}"
    try:
        if how == "mmap":
            write_shm_file(path, state_dict, 1)
            return
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            stored = {meta.offset: name for name, meta in handle.manifest.items()}
            for offset, name in stored.items():  # tied weights once, as the file stores them
                buf = memoryview(state_dict[name].reshape(-1).view(torch.uint8).numpy())
                os.pwrite(fd, buf, offset)
        finally:
            os.close(fd)
    finally:
        if os.path.exists(path):
            os.unlink(path)


def _lease(handle) -> None:
    from forge.weights import lease_shm_file

    views, lease = lease_shm_file(handle.location, handle.version, handle.manifest)
    del views
    lease.release()


def _minor_faults() -> int:
    """Page faults of this process so far: a cost count that other load does not disturb."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _preadv_into(handle, own: dict[str, torch.Tensor]) -> None:
    fd = os.open(handle.location, os.O_RDONLY)
    try:
        stored = {meta.offset: name for name, meta in handle.manifest.items()}
        for offset, name in stored.items():  # tied weights once (they share the memory)
            buf = memoryview(own[name].reshape(-1).view(torch.uint8).numpy())
            os.preadv(fd, [buf], offset)
    finally:
        os.close(fd)


def bench_memcpy(nbytes: int, repeats: int) -> dict:
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    warm = time_sync(lambda: dst.copy_(src), repeats * 2, warmup=1)
    fresh = time_sync(lambda: torch.empty_like(src).copy_(src), repeats, warmup=1)
    return {"warm": statistics.median(warm), "fresh": statistics.median(fresh)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="forge-bench-weights-") as tmp:
        n_params = build_model(Path(tmp), args.hidden, args.layers, args.vocab)

        async def run():
            try:
                res = await bench_sync(tmp, args.repeats)
                res["breakdown"] = await asyncio.to_thread(
                    bench_breakdown, tmp, res["handle"], args.repeats
                )
                await res["trainer"].close.call_one()
                return res
            finally:
                await shutdown()

        res = loops.run(run())
    nbytes = res["handle"].nbytes
    mem = bench_memcpy(nbytes, args.repeats)
    med = statistics.median
    push, fan, one = med(res["push"]), med(res["fanout"]), med(res["one"])
    bd = res["breakdown"]
    print(
        f"model: {n_params / 1e6:.1f}M params, {nbytes / 1e9:.3f} GB pushed (fp32); "
        f"trainer + 2x2 replicas started in {res['startup']:.1f} s; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    cold = res["cold"]
    print(
        f"first (cold) push {cold['push'] * 1e3:.1f} ms, first pull+swap (fanout) "
        f"{cold['pull'] * 1e3:.1f} ms; medians below are after {WARMUP_ROUNDS} warm-up rounds"
    )
    rows = [
        ("push (trainer -> shm)", push),
        ("pull+swap, fanout to 2 replicas", fan),
        ("pull+swap, one replica (route)", one),
        ("copying (share=False): fanout", med(res["fanout_copy"])),
        ("copying (share=False): one replica", med(res["one_copy"])),
        ("memcpy, preallocated (floor)", mem["warm"]),
        ("memcpy into fresh memory", mem["fresh"]),
    ]
    for name, s in rows:
        print(f"{name:40s} median {s * 1e3:9.1f} ms  {gbps(nbytes, s)}")
    labels = {
        "fresh": "pull_handle -> fresh tensors",
        "load_in_place": "load_in_place(model, pulled)",
        "into": "pull_handle(into=model)",
        "lease": "lease_shm_file (share: no copy)",
        "preadv": "reference: os.preadv into model",
        "recycled": "push: transport, recycled file",
        "push": "push: write_shm_file (new file)",
        "pwrite": "reference: os.pwrite into new file",
    }
    print(f"breakdown in this process ({nbytes // 4096} pages of 4 KiB moved):")
    for key, label in labels.items():
        s, faults = bd[key]
        print(f"  {label:38s} median {s * 1e3:9.1f} ms  {gbps(nbytes, s)}  {faults:8.0f} faults")
    print(f"replicas hold identical weights after sync: {res['replicas_agree']}")
    copy_ratio = med(res["fanout_copy"]) / mem["warm"]
    print(f"sync_vs_memcpy={fan / mem['warm']:.2f} copying_vs_memcpy={copy_ratio:.2f}")


if __name__ == "__main__":
    main()
