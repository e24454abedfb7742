"""Weight sync with ``weights: {type: broadcast}`` against ``shm``, on one host.

    python -m benchmarks.weight_broadcast [--repeats 5] [--hidden 768] [--layers 12]

The weight-sync benchmark's model (``benchmarks.weights.build_model``: ~110M fp32 parameters,
0.44 GB), a ``Trainer`` actor and a 2-replica ``Generator`` service (hf backend) per transport,
synced by the run's own ``forge.run.weights.WeightSync`` (push, then every replica loads it;
no overlap), side by side in one run, medians over ``--repeats`` versions after 2 warm-up
versions:

- **broadcast (gloo)**: the trainer snapshots the version and sends it to both replicas in one
  gloo group over loopback TCP (on GPUs the same code runs NCCL: not measured here);
- **shm, copying**: the trainer writes ``/dev/shm``, each replica copies it into its model
  (``share: false``: what a GPU replica does);
- **shm, sharing**: the default on CPU (replicas compute with the file in place).

Every replica is checked to serve the last version at the end (the bytes themselves are
checked by ``tests/integration/components/test_weight_broadcast.py``). The last line is
machine-readable: ``broadcast_vs_copying=<ratio>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.weights import build_model
from controller import loops, shutdown

WARMUP = 2


async def bench(model_dir: str, repeats: int) -> dict[str, list[float]]:
    from forge.actors.generator import Generator
    from forge.actors.trainer import Trainer
    from forge.generation import GeneratorConfig
    from forge.run.weights import WeightSync
    from forge.training.trainer_config import TrainerConfig
    from forge.weights import WeightTransportConfig

    setups = {
        "broadcast (gloo)": WeightTransportConfig(type="broadcast", backend="gloo"),
        "shm, copying": WeightTransportConfig(share=False, prefix="bench-copy"),
        "shm, sharing": WeightTransportConfig(prefix="bench-share"),
    }
    pairs = {}
    for name, w in setups.items():
        trainer = await Trainer.as_actor(TrainerConfig(model=model_dir, device="cpu", weights=w))
        gen = await Generator.options(num_replicas=2).as_service(
            GeneratorConfig(model=model_dir, backend="hf", weights=w)
        )
        pairs[name] = (trainer, gen, WeightSync(trainer, gen, overlap=False))
    out: dict[str, list[float]] = {name: [] for name in pairs}
    for v in range(1, WARMUP + repeats + 1):
        for name, (_, _, sync) in pairs.items():
            t0 = time.perf_counter()
            await sync.push(v)
            if v > WARMUP:
                out[name].append(time.perf_counter() - t0)
    for name, (trainer, gen, _) in pairs.items():
        versions = await gen.get_version.fanout()
        assert versions == [WARMUP + repeats] * 2, f"{name}: replicas at versions {versions}"
        await trainer.close.call_one()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32000)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="forge-bcast-bench-") as tmp:
        params = build_model(Path(tmp) / "model", a.hidden, a.layers, a.vocab)

        async def run():
            try:
                return await bench(str(Path(tmp) / "model"), a.repeats)
            finally:
                await shutdown()

        r = loops.run(run())
    print(
        f"model {params / 1e6:.0f}M fp32 parameters ({params * 4 / 1e9:.2f} GB), 2 generator "
        f"replicas, push + load on both, medians of {a.repeats}"
    )
    med = {k: statistics.median(v) for k, v in r.items()}
    for name, runs in r.items():
        print(f"{name:18s} median {med[name]:6.2f} s  runs " + " ".join(f"{x:.2f}" for x in runs))
    print(
        f"broadcast_vs_copying={med['broadcast (gloo)'] / med['shm, copying']:.2f} "
        f"broadcast_vs_sharing={med['broadcast (gloo)'] / med['shm, sharing']:.2f}"
    )


if __name__ == "__main__":
    main()
