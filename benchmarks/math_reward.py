"""Time ``MathReward`` on ordinary answers: milliseconds per answer, warm.

    python -m benchmarks.math_reward [--repeats 5]

256 answers of four shapes (``\\boxed{n}``, ``Answer: a/b``, ``\\frac``, a bare number) against
their targets, 3/4 of them right. Prints the median over ``--repeats`` rounds of the cost per
answer called one by one (``reward(p, r, t)``) and, where the tree has it, in one
``score_batch`` (what ``RewardActor.evaluate_batch`` uses), plus the first call (which starts
the scoring process where there is one). To compare with another commit, export its tree and
put it first on ``sys.path``: ``python benchmarks/math_reward.py --tree /tmp/old``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time


def items() -> list[tuple[str, str, str]]:
    rng = random.Random(0)
    out = []
    for i in range(256):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        kind = i % 4
        response = [
            f"so \\boxed{{{a + b}}}",
            f"Answer: {a}/{b}",
            f"\\boxed{{\\frac{{{a}}}{{{b}}}}}",
            f"we get {a * b}",
        ][kind]
        target = [str(a + b), str(a / b), f"{a}/{b}", str(a * b + (i % 2))][kind]
        out.append(("p", response, target))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tree", help="import forge from this source tree instead")
    a = p.parse_args()
    if a.tree:
        sys.path.insert(0, a.tree)
    import logging

    logging.disable(logging.WARNING)  # the old tree's math-verify warnings
    from forge.rewards import MathReward

    reward, batch = MathReward(), items()
    t0 = time.perf_counter()
    reward(*batch[0])
    print(f"first call: {(time.perf_counter() - t0) * 1e3:.0f} ms")
    ways = {"one by one": lambda: [reward(*it) for it in batch]}
    if hasattr(reward, "score_batch"):
        ways["score_batch"] = lambda: reward.score_batch(batch)
    for name, run in ways.items():
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            scores = run()
            times.append((time.perf_counter() - t0) * 1e3 / len(batch))
        assert sum(scores) == 192, sum(scores)
        print(f"{name}: {statistics.median(times):.2f} ms/answer (median of {a.repeats})")
    if hasattr(reward, "close"):
        reward.close()


if __name__ == "__main__":
    main()
