"""The pure parts of ``benchmarks.real_e2e``: the prompts each configuration sends."""

from apps.arith.task import INSTRUCTION
from benchmarks.real_e2e import LONG, SETUPS, LongAddition


def test_short_rows_are_the_main_jobs_prompts_and_gen_heavy_asks_for_the_working():
    short = SETUPS["short"].rows(4, seed=0)
    long = SETUPS["gen-heavy"].rows(4, seed=0)
    assert [r["target"] for r in short] == [r["target"] for r in long]  # same sums
    assert all(r["prompt"][0]["content"].endswith(INSTRUCTION) for r in short)
    assert all(r["prompt"][0]["content"].endswith(LONG) for r in long)
    assert SETUPS["gen-heavy"].max_tokens == 128


def test_long_addition_resumes_where_it_stopped():
    a = LongAddition(seed=3)
    first = [a.sample() for _ in range(5)]
    b = LongAddition(seed=99)
    b.load_state_dict(a.state_dict())
    assert [b.sample() for _ in range(3)] == [a.sample() for _ in range(3)]
    assert all(LONG in r["prompt"][0]["content"] for r in first)
