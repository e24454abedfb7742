"""Chaos on the CPU demo: SIGKILL a random generator or reward replica every ~20 s.

    python -m benchmarks.chaos [--every 20] [--seed 0] [--demo-seed 0] [--sft-steps 250]
                               [--grpo-steps 500]
                               [--target 0.9] [--run-dir DIR]

Runs the demo (``apps/sumdigits/cpu.yaml``: SFT, then GRPO) in this process with two
generator and two reward replicas, and beside it a killer task that waits ``every`` seconds
(jittered by +-50%, seeded) and SIGKILLs one random replica of the generator or reward
service. It kills a replica only while another replica of its service is serving, so what is
measured is failover, not an outage. The services re-send the killed replica's requests
elsewhere and restart it (a generator loads the latest pushed weights on recovery).

At the end it prints the steps done, held-out accuracy (the demo's target: >= 0.9), the
kills, per service the ``route`` requests sent / retried / completed / failed / cancelled
(``Service.request_counts``), the rollout groups produced / kept / filtered / dropped and
the episodes lost (a group whose production raised or gave up), the failover times (kill ->
replica out of rotation -> replica back, from the service's replica states), the processes
left behind and the machine load. The last line is machine-readable:

    chaos_kills=<n> lost_requests=<n> lost_episodes=<n> heldout_accuracy=<x> orphans=<n> ...

``lost_requests`` counts requests that failed or were never answered (cancelled ones: the
rollouts in flight when training stopped, are not lost). The demo's rollout manager is
counted by a subclass put in place for the run (``counting_rollouts``); nothing in the app
changes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

from controller import loops

REPO = Path(__file__).resolve().parent.parent
KILLED_SERVICES = ("Generator", "RewardActor")


class Killer:
    """Every ~``every`` s, SIGKILL one healthy replica of a generator or reward service of
    this process, and time how it fails over (out of rotation, then back)."""

    def __init__(self, every: float, seed: int):
        self.every = every
        self.rng = random.Random(seed)
        self.kills: list[dict] = []
        self.services: dict[str, object] = {}  # every service seen, kept for its counts
        self.pids: set[int] = set()  # every process of the run seen, for the orphan check
        self._timers: set[asyncio.Task] = set()

    def _live_services(self) -> list:
        from controller._runtime import get_runtime

        svcs = [s for s in get_runtime().services if s.name.startswith(KILLED_SERVICES)]
        for s in svcs:
            self.services.setdefault(f"{s.name}@{id(s):x}", s)
        return svcs

    def _victims(self) -> list[tuple[object, int, list[int]]]:
        out = []
        for svc in self._live_services():
            healthy = {i: m for i, m in svc.metrics().items() if m["state"] == "healthy"}
            if len(healthy) < 2:  # keep one replica serving: failover, not outage
                continue
            out += [(svc, i, m["pids"]) for i, m in healthy.items() if m["pids"]]
        return out

    def note_pids(self) -> None:
        with contextlib.suppress(psutil.Error):
            self.pids.update(c.pid for c in psutil.Process().children(recursive=True))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every * self.rng.uniform(0.5, 1.5))
            self.note_pids()
            victims = self._victims()
            if not victims:
                continue
            svc, index, pids = self.rng.choice(victims)
            restarts = svc.metrics()[index]["restarts"]
            t0 = time.monotonic()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            kill = {"service": svc.name, "replica": index, "pids": pids, "at": t0}
            self.kills.append(kill)
            print(f"[chaos] SIGKILL {svc.name} replica {index} (pids {pids})", flush=True)
            timer = asyncio.create_task(self._time_failover(svc, index, restarts, t0, kill))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)

    async def _time_failover(self, svc, index: int, restarts: int, t0: float, kill: dict):
        """Kill -> out of rotation (``down_ms``) -> healthy again (``back_s``); 120 s at most."""
        while time.monotonic() - t0 < 120:
            m = svc.metrics().get(index)
            if m is None:
                return
            if "down_ms" not in kill and m["state"] != "healthy":
                kill["down_ms"] = (time.monotonic() - t0) * 1000
            if m["state"] == "healthy" and m["restarts"] > restarts:
                kill.setdefault("down_ms", (time.monotonic() - t0) * 1000)
                kill["back_s"] = time.monotonic() - t0
                self.note_pids()
                return
            await asyncio.sleep(0.005)


@contextlib.contextmanager
def counting_rollouts(app):
    """Within: the RL app's (module ``app``) ``RolloutManager`` is a subclass that counts
    every group its producer started, returned, gave up on (``None``) or raised in; yields
    the instances."""
    from forge import RolloutManager

    made: list = []

    class Counting(RolloutManager):
        def __init__(self, produce, consume, **kwargs):
            self.producer = dict.fromkeys(
                ("started", "returned", "gave_up", "raised", "cancelled"), 0
            )
            self.consumed_episodes = 0

            async def counted_produce():
                self.producer["started"] += 1
                try:
                    group = await produce()
                except asyncio.CancelledError:
                    self.producer["cancelled"] += 1
                    raise
                except BaseException:
                    self.producer["raised"] += 1
                    raise
                self.producer["returned" if group else "gave_up"] += 1
                return group

            async def counted_consume(group):
                out = await consume(group)
                self.consumed_episodes += len(group)
                return out

            super().__init__(counted_produce, counted_consume, **kwargs)
            made.append(self)

    original = app.RolloutManager
    app.RolloutManager = Counting
    try:
        yield made
    finally:
        app.RolloutManager = original


def _overrides(args) -> list[str]:
    return [
        f"sft.steps={args.sft_steps}",
        f"rl.steps={args.grpo_steps}",
        f"rl.trainer.schedule.total_steps={args.grpo_steps}",
        "rl.replicas.generator=2",
        "rl.replicas.rewards=2",
        f"rl.eval.every={args.eval_every}",
        f"seed={args.demo_seed}",
    ]


async def _run(args, run_dir: Path) -> dict:
    from controller import shutdown
    from forge import sft_then_rl
    from forge.config import dump_config
    from forge.launch import app_module, load_app

    config = REPO / "apps" / "sumdigits" / "cpu.yaml"
    _, cfg = load_app(config, _overrides(args))
    rl_app = app_module(cfg.rl.app, f"{config}: grpo", needs=("RolloutManager",))
    dump_config(cfg, run_dir / "config.yaml")
    killer = Killer(args.every, args.seed)
    task = asyncio.create_task(killer.run())
    try:
        with counting_rollouts(rl_app) as managers:
            result = await sft_then_rl(cfg, run_dir, False, "sumdigits")
    finally:
        task.cancel()
        killer.note_pids()
        counts = {k: s.request_counts() for k, s in killer.services.items()}
        await asyncio.shield(asyncio.ensure_future(shutdown()))
    return {
        "result": result,
        "killer": killer,
        "counts": counts,
        "managers": managers,
        "group_size": cfg.rl.rollout.group_size,
    }


def _orphans(pids: set[int], timeout: float = 10.0) -> list[int]:
    """The run's processes (and any child of this one) still alive after ``timeout`` s."""
    with contextlib.suppress(psutil.Error):
        pids = pids | {c.pid for c in psutil.Process().children(recursive=True)}

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    deadline = time.monotonic() + timeout
    left = sorted(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        time.sleep(0.1)
    return [p for p in left if alive(p)]


def report(out: dict, run_dir: Path, minutes: float, load: tuple) -> str:
    """Print the figures; return the machine-readable last line."""
    from forge import M

    killer, result = out["killer"], out["result"]
    steps = [r["step"] for r in result["history"] if M.LOSS in r]
    print(f"\nchaos on the CPU demo ({run_dir}), {minutes:.1f} min")
    print(f"steps done: {max(steps) if steps else 0}")
    acc, sft = result["last"], result["first"]
    print(f"held-out accuracy: {sft:.3f} after SFT -> {acc:.3f} (target >= 0.90)")
    print(
        f"kills: {len(killer.kills)}  "
        + ", ".join(f"{k['service']}[{k['replica']}]" for k in killer.kills)
    )
    down = [k["down_ms"] for k in killer.kills if "down_ms" in k]
    back = [k["back_s"] for k in killer.kills if "back_s" in k]
    if down:
        print(
            f"failover: out of rotation {statistics.median(down):.0f} ms median "
            f"({max(down):.0f} max); replica back {statistics.median(back or [0]):.1f} s "
            f"median ({max(back or [0]):.1f} max; {len(back)} of {len(killer.kills)} back)"
        )
    lost_requests = retried = 0
    for name, c in out["counts"].items():
        retried += c["retried"]
        unanswered = c["sent"] - c["completed"] - c["failed"] - c["cancelled"]
        lost_requests += c["failed"] + unanswered
        print(
            f"requests {name.split('@')[0]:<14} sent {c['sent']:6d}  retried {c['retried']:4d}  "
            f"completed {c['completed']:6d}  failed {c['failed']}  cancelled {c['cancelled']}  "
            f"unanswered {unanswered}"
        )
    lost_groups = 0
    for m in out["managers"]:
        p = m.producer
        lost_groups += p["raised"] + p["gave_up"]
        print(
            f"groups: started {p['started']}  produced {m.counts['produced']}  kept "
            f"{m.counts['kept']} ({m.consumed_episodes} episodes into the buffer)  filtered "
            f"{m.counts['filtered']}  dropped {m.counts['dropped']}  raised {p['raised']}  "
            f"gave up {p['gave_up']}  in flight at the end {p['cancelled']}"
        )
    group_size = out["group_size"]
    orphans = _orphans(killer.pids)
    print(f"processes seen: {len(killer.pids)}; left behind: {orphans or 'none'}")
    print(
        f"load average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f} "
        f"({os.cpu_count()} cores)"
    )
    return (
        f"chaos_kills={len(killer.kills)} lost_requests={lost_requests} "
        f"lost_episodes={lost_groups * group_size} heldout_accuracy={acc:.3f} "
        f"orphans={len(orphans)} steps={max(steps) if steps else 0} sft_accuracy={sft:.3f} "
        f"retried={retried} replicas_back={len(back)} minutes={minutes:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=20.0, help="seconds between kills (+-50%%)")
    p.add_argument("--seed", type=int, default=0, help="the killer's seed (which replica, when)")
    p.add_argument("--demo-seed", type=int, default=0, help="the demo's seed (model, data, roles)")
    p.add_argument("--sft-steps", type=int, default=250)
    p.add_argument("--grpo-steps", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--run-dir", help="default: a new temporary directory")
    args = p.parse_args(argv)
    from controller._runtime import install_signal_handlers

    install_signal_handlers()
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="forge-chaos-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    t0 = time.perf_counter()
    out = loops.run(_run(args, run_dir))
    line = report(out, run_dir, (time.perf_counter() - t0) / 60, load)
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
