"""forge.run.parity: the config's bounds, the in-run watch, the cause it names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from forge.run.parity import ParityConfig, ParityWatch, PolicyMismatchError, likely_cause


def _run_cfg(max_policy_age: int = 0, **parity) -> SimpleNamespace:
    return SimpleNamespace(
        parity=ParityConfig(**parity),
        max_policy_age=max_policy_age,
        generator=SimpleNamespace(dtype="bfloat16"),
        trainer=SimpleNamespace(dtype="float32", autocast=None),
    )


def test_the_watch_stops_after_patience_steps_in_a_row_above_the_bound():
    watch = ParityWatch(_run_cfg(max_mismatch_kl=0.01, patience=3))
    for step, kl in enumerate([0.5, 0.5, 0.001, 0.5, 0.5]):  # a dip resets the count
        watch.observe(step, {"mismatch_kl": kl, "logprob_gap": 0.1, "logprob_gap_max": 1.0})
    with pytest.raises(PolicyMismatchError, match=r"step 5: .* for 3 on-policy steps"):
        watch.observe(5, {"mismatch_kl": 0.5, "logprob_gap": 0.1, "logprob_gap_max": 1.0})


@pytest.mark.parametrize("cfg", [_run_cfg(max_policy_age=1), _run_cfg(patience=0)])
def test_off_policy_or_patience_zero_only_logs(cfg):
    watch = ParityWatch(cfg)
    for step in range(10):
        watch.observe(step, {"mismatch_kl": 9.0, "logprob_gap": 1.0, "logprob_gap_max": 9.0})


@pytest.mark.parametrize(
    "kw", [{"max_mismatch_kl": 0.0}, {"patience": -1}, {"prompts": 0}, {"tokens": 0}]
)
def test_bad_bounds_are_named(kw):
    with pytest.raises(ValueError, match=f"parity.{next(iter(kw))}"):
        ParityConfig(**kw)


def test_the_cause_names_precision_only_when_the_two_differ():
    m = {"mismatch_kl": 0.3}
    assert "bfloat16" in likely_cause(m, "bfloat16", "float32")
    same = likely_cause(m, "float32", "float32")
    assert "precision cannot explain it" in same and "forge models check" in same
