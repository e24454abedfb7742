"""benchmarks.e2e's pure parts: TRL's best thread count per repetition, CPU utilisation from
process-tree samples, and the report's machine-readable last lines (sampling a real process
tree: tests/integration/components/test_process_tree_cpu.py)."""

from __future__ import annotations

import math

import pytest

from benchmarks import e2e
from benchmarks.common import interpolate, utilisation


def run(s_per_step: float, threads: int = 0, **kw) -> dict:
    return {"s_per_step": s_per_step, "threads": threads, **kw}


def test_best_of_threads_picks_the_faster_run_per_repetition():
    one = [run(0.50, 1), run(0.40, 1), run(0.60, 1)]
    two = [run(0.30, 2), run(0.45, 2), run(0.90, 2)]
    best = e2e.best_of_threads({1: one, 2: two})
    assert [(r["s_per_step"], r["threads"]) for r in best] == [(0.30, 2), (0.40, 1), (0.60, 1)]
    # Per repetition, not the best median: medians are 0.50 (1t) and 0.45 (2t), but the
    # per-repetition best has median 0.40.
    assert e2e.median(best, "s_per_step") == 0.40


def test_best_of_threads_with_one_thread_count_run():
    one = [run(0.5, 1), run(0.4, 1)]
    assert e2e.best_of_threads({1: one}) == one
    assert e2e.best_of_threads({1: one, 2: []}) == one


def test_interpolate_and_utilisation_hand_computed():
    # Cumulative CPU seconds of a process tree: 1 core busy for 0-2 s, 2 cores for 2-4 s.
    samples = [(10.0, 0.0), (11.0, 1.0), (12.0, 2.0), (13.0, 4.0), (14.0, 6.0)]
    assert interpolate(samples, 10.0) == 0.0
    assert interpolate(samples, 12.5) == 3.0
    assert interpolate(samples, 14.0) == 6.0
    # 11.5 -> 13.5: 1.5 -> 5.0 CPU s over 2 s wall on 2 cores.
    assert utilisation(samples, 11.5, 13.5, cores=2) == pytest.approx(3.5 / 4)
    assert utilisation(samples, 12.0, 14.0, cores=2) == pytest.approx(1.0)


def test_utilisation_rejects_windows_outside_the_samples():
    samples = [(1.0, 0.0), (2.0, 1.0)]
    with pytest.raises(ValueError, match="outside the sampled span"):
        utilisation(samples, 0.5, 2.0, cores=1)
    with pytest.raises(ValueError, match="empty window"):
        utilisation(samples, 2.0, 1.0, cores=1)
    with pytest.raises(ValueError, match="no samples"):
        interpolate([], 1.0)


def fake_results() -> dict:
    forge = {"wait_batch_s": 0.1, "train_s": 0.2, "weight_sync_s": 0.01, "rest_s": 0.02}
    common = {"tok_per_s": 100.0, "reward": 0.5, "completion_len": 5.0, "cpu_util": 0.9}
    load = {"load_before": 1.0, "load_after": 2.0}

    def by_system(scale: float) -> dict:
        f0 = [run(0.50 * scale, policy_age=0.0, **forge, **common, **load)] * 3
        f1 = [run(0.40 * scale, policy_age=1.0, **forge, **common, **load)] * 3
        t1 = [run(0.60 * scale, 1, **common, **load)] * 3
        t2 = [run(0.80 * scale, 2, **common, **load)] * 3
        out = {"forge0": f0, "forge1": f1, "trl1": t1, "trl2": t2}
        out[e2e.BEST] = e2e.best_of_threads({1: t1, 2: t2})
        return out

    return {"short": by_system(1.0), "gen-heavy": by_system(10.0)}


def test_report_last_lines_use_trl_best():
    order = e2e.setups(e2e.parse_args([]))
    lines = e2e.report_lines(fake_results(), order)
    # TRL best 0.60 (1 thread) over Forge 0.50 / 0.40.
    assert lines[-1] == "forge_vs_trl_onpolicy=1.20 forge_vs_trl_async=1.50"
    assert lines[-2] == "gen_heavy_forge_vs_trl_onpolicy=1.20 gen_heavy_forge_vs_trl_async=1.50"
    table = "\n".join(lines)
    assert "trl best of 1|2 threads" in table and "0.600(1t)" in table
    assert "90%" in table and "1.0>2.0" in table  # CPU utilisation and load columns


def test_report_with_one_configuration_and_missing_systems():
    order = e2e.setups(e2e.parse_args(["--config", "gen-heavy", "--only", "forge1"]))
    results = {"gen-heavy": {"forge1": fake_results()["gen-heavy"]["forge1"]}}
    last = e2e.report_lines(results, order)[-1]
    assert last.startswith("gen_heavy_forge_vs_trl_onpolicy=nan")
    on, off = e2e.ratios(results["gen-heavy"])
    assert math.isnan(on) and math.isnan(off)


def test_window_needs_every_step_mark():
    samples = [(0.0, 0.0), (10.0, 10.0)]
    w = e2e.window([0.0, 1.0, 2.0, 4.0, 6.0], samples, warmup=1, steps=3)
    assert w["s_per_step"] == pytest.approx(5.0 / 3)
    assert w["cpu_util"] == pytest.approx(1.0 / e2e.CORES)  # one CPU second per second
    with pytest.raises(RuntimeError, match="expected 6 step marks"):
        e2e.window([0.0, 1.0, 2.0], samples, warmup=2, steps=3)


def test_bad_arguments_are_named():
    with pytest.raises(SystemExit):
        e2e.parse_args(["--gen-steps", "0"])
    with pytest.raises(SystemExit):
        e2e.parse_args(["--config", "long"])


def test_forge_config_is_the_demos_rl_stage_with_the_setups_shape(tmp_path):
    # The benchmark builds its Forge side from apps/sumdigits/cpu.yaml; a renamed stage or
    # key there must fail here, not half-way into a 16-minute run.
    setup = e2e.setups(e2e.parse_args(["--config", "short"]))[0]
    cfg = e2e.forge_config(tmp_path / "model", 1, setup, threads=2)
    assert cfg.app == "apps.grpo.main"
    assert cfg.policy.model == str(tmp_path / "model")
    assert cfg.steps == setup.warmup + setup.steps and cfg.max_policy_age == 1
    rollout = cfg.rollout
    assert (rollout.prompts_per_step, rollout.group_size, rollout.max_tokens) == (
        setup.prompts,
        setup.group,
        setup.max_tokens,
    )
    assert rollout.filter == "keep_all" and cfg.threads_per_actor == 2
