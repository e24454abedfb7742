"""Actor process start-up: a zygote's fork against a fresh interpreter, side by side.

    python -m benchmarks.startup [--procs 1 4 8] [--repeats 3]

Each trial spawns ``--procs`` processes with a run's actor variables
(``forge.run.actor_env_vars``) and constructs in each an actor that imports what a generator
or trainer imports (torch, ``transformers.AutoModelForCausalLM``), then measures the wall
time until every actor is constructed, and the CPU seconds the processes spent (the
zygote's included), and the time to bring up one more while one lives (a crashed replica's
restart). Both modes run in alternation in one process; every trial ends with
``shutdown()``, so each pays for its own zygote. The last line is machine-readable:
``procs=<n> plain_s=<median> zygote_s=<median> speedup=<x>`` for the largest ``--procs``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psutil

from controller import Actor, endpoint, loops, shutdown
from forge.run import actor_env_vars


class Importer(Actor):
    def __init__(self):
        from transformers import AutoModelForCausalLM  # what a generator or trainer imports

        self.cls = AutoModelForCausalLM.__name__

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def _tree_cpu_s() -> float:
    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


async def trial(procs: int, zygote: bool) -> tuple[float, float]:
    """(seconds until every actor is constructed, CPU seconds of the processes)."""
    os.environ["FORGE_ZYGOTE"] = "1" if zygote else "0"
    t0 = time.perf_counter()
    mesh = await Importer.options(procs=procs, env_vars=actor_env_vars(1)).as_actor()
    wall = time.perf_counter() - t0
    await mesh.pid.call()
    cpu = _tree_cpu_s()
    await shutdown()
    return wall, cpu


async def respawn(zygote: bool, repeats: int) -> list[float]:
    """Seconds to bring up one more such actor while a run's processes live (a crashed
    replica's restart): the zygote is warm by then."""
    os.environ["FORGE_ZYGOTE"] = "1" if zygote else "0"
    await Importer.options(procs=1, env_vars=actor_env_vars(1)).as_actor()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await Importer.options(procs=1, env_vars=actor_env_vars(1)).as_actor()
        out.append(time.perf_counter() - t0)
    await shutdown()
    return out


async def main(args) -> None:
    print(f"{psutil.cpu_count()} cores; FORGE_PRELOAD={actor_env_vars(1)['FORGE_PRELOAD']}")
    print(f"{'procs':>5} {'mode':>7} {'median s':>9} {'runs (s)':>24} {'cpu s':>7}")
    last = None
    for n in args.procs:
        got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.repeats):
            for zygote in (False, True):
                got[zygote].append(await trial(n, zygote))
        med = {}
        for zygote in (False, True):
            walls = [w for w, _ in got[zygote]]
            med[zygote] = statistics.median(walls)
            cpu = statistics.median(c for _, c in got[zygote])
            runs = " ".join(f"{w:.2f}" for w in walls)
            mode = "zygote" if zygote else "plain"
            print(f"{n:>5} {mode:>7} {med[zygote]:>9.2f} {runs:>24} {cpu:>7.1f}")
        last = (n, med[False], med[True])
    for zygote in (False, True):
        walls = await respawn(zygote, args.repeats)
        mode = "zygote" if zygote else "plain"
        runs = " ".join(f"{w:.2f}" for w in walls)
        print(
            f"{'+1':>5} {mode:>7} {statistics.median(walls):>9.2f} {runs:>24}   (one more, "
            "beside a live one: a restart)"
        )
    assert last is not None
    n, plain, zyg = last
    print(f"procs={n} plain_s={plain:.2f} zygote_s={zyg:.2f} speedup={plain / zyg:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    loops.run(main(parser.parse_args()))
