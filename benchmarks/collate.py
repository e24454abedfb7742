"""Time ``collate_episodes`` (the replay buffer's batch assembly, on every training step).

    python -m benchmarks.collate [--repeats 7]

Two batches of 64 episodes: single-turn (38 prompt + 6 response tokens, the CPU demo's
shape) and multi-turn (20 + 60 tokens with a loss mask). Prints the median milliseconds per
call over ``--repeats`` rounds of 50 calls. To compare with another commit, check it out in
a worktree and run this file with that tree first on ``sys.path``:
``python benchmarks/collate.py --tree /tmp/old``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--tree", help="import forge from this source tree instead")
    a = p.parse_args()
    if a.tree:
        sys.path.insert(0, a.tree)
    from forge.replay.collate import collate_episodes
    from forge.types import Episode

    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(500) for _ in range(n)]

    single = [
        Episode(f"s{i}", ids(38), ids(6), [-0.5] * 6, 1.0, 0, advantage=0.3) for i in range(64)
    ]
    multi = [
        Episode(f"m{i}", ids(20), ids(60), [-0.5] * 60, 1.0, 0, loss_mask=[1, 0] * 30)
        for i in range(64)
    ]
    for name, batch in (
        ("single-turn 64 x (38 + 6)", single),
        ("multi-turn 64 x (20 + 60)", multi),
    ):
        rounds = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            for _ in range(50):
                collate_episodes(batch)
            rounds.append((time.perf_counter() - t) / 50 * 1e3)
        print(f"{name}: {statistics.median(rounds):.3f} ms per batch")


if __name__ == "__main__":
    main()
