"""Schedules of loss/KL/algorithm phases: cumulative overrides, validation, resume."""

from __future__ import annotations

import pytest

from forge.config.schema import config_from_dict
from forge.losses import LossConfig
from forge.training.phases import PhaseConfig, PhaseTracker, resolve_phases, validate_phases

YAML_PHASES = [
    {"at": 0, "loss": {"type": "grpo", "kl_coef": 0.2}},
    {"at": 30, "loss": {"kl_coef": 0.05}},
    {
        "at": 60,
        "name": "explore",
        "loss": {"clip_eps_high": 0.28, "aggregation": "seq_mean"},
        "rollout": {"filter": "nonzero_variance", "sampling": {"temperature": 1.2}},
    },
    {"at": 90, "loss": {"type": "reinforce"}, "rollout": {"sampling": {"top_p": 0.9}}},
]


def test_overrides_are_cumulative():
    base = LossConfig(type="grpo", kl_coef=0.0, tis_cap=2.0)
    p0, p1, p2, p3 = resolve_phases(YAML_PHASES, base)
    assert p0.loss == LossConfig(type="grpo", kl_coef=0.2, tis_cap=2.0)
    assert p1.loss == LossConfig(type="grpo", kl_coef=0.05, tis_cap=2.0)
    assert p2.loss == LossConfig(
        type="grpo", kl_coef=0.05, tis_cap=2.0, clip_eps_high=0.28, aggregation="seq_mean"
    )
    assert p3.loss == LossConfig(
        type="reinforce", kl_coef=0.05, tis_cap=2.0, clip_eps_high=0.28, aggregation="seq_mean"
    )
    assert p1.rollout == {} and p1.loss_overrides == {"kl_coef": 0.05}
    # nested rollout dicts merge key by key
    assert p3.rollout == {
        "filter": "nonzero_variance",
        "sampling": {"temperature": 1.2, "top_p": 0.9},
    }
    assert p3.rollout_overrides == {"sampling": {"top_p": 0.9}}
    assert base == LossConfig(type="grpo", kl_coef=0.0, tis_cap=2.0)  # not modified
    assert "phase 2 'explore' from step 60" in p2.describe() and "rollout" in p2.describe()


def test_null_returns_a_field_to_the_type_default():
    phases = [
        {"at": 0, "loss": {"clip_eps_high": 0.28}},
        {"at": 5, "loss": {"clip_eps_high": None}},
    ]
    _, p1 = resolve_phases(phases, LossConfig())
    assert p1.loss.resolved_clip() == (0.2, 0.2)


def test_changes_and_current_for_resume():
    tracker = PhaseTracker(YAML_PHASES[1:], LossConfig(kl_coef=0.2))  # first phase at 30
    assert [tracker.changes(s) is not None for s in (0, 29, 30, 31, 60, 90)] == [
        False,
        False,
        True,
        False,
        True,
        True,
    ]
    assert tracker.changes(60).name == "explore"
    assert tracker.current(0) is None and tracker.current(29) is None  # base config in force
    assert tracker.current(30).at == 30 and tracker.current(59).loss.kl_coef == 0.05
    assert tracker.current(75).at == 60 and tracker.current(75).loss.clip_eps_high == 0.28
    assert tracker.current(10_000).loss.type == "reinforce"
    assert tracker.current(75) is tracker.changes(60)  # the same resolved phase


def test_phase_configs_parse_from_yaml_data():
    phases = [config_from_dict(PhaseConfig, p) for p in YAML_PHASES]
    assert phases[2].rollout["sampling"] == {"temperature": 1.2} and phases[2].name == "explore"
    assert resolve_phases(phases, LossConfig()) == resolve_phases(YAML_PHASES, LossConfig())
    typo = r"(?s)invalid config phases\[0\].*unknown key 'lss' \(did you mean 'loss'\?\)"
    with pytest.raises(ValueError, match=typo):
        resolve_phases([{"at": 0, "lss": {}}], LossConfig())


@pytest.mark.parametrize(
    "phases, exc, match",
    [
        ([{"at": -1}], ValueError, r"phases\[0\].at must be >= 0, got -1"),
        (
            [{"at": 0}, {"at": 10}, {"at": 10}],
            ValueError,
            r"phases\[2\].at = 10 is not after phases\[1\].at = 10; list phases by strictly",
        ),
        ([{"at": 5}, {"at": 3}], ValueError, r"phases\[1\].at = 3 is not after"),
        (
            [{"at": 0}, {"at": 10, "loss": {"kl_coeff": 0.1}}],
            ValueError,
            r"phases\[1\].loss.kl_coeff: not a LossConfig field \(did you mean 'kl_coef'\?\); "
            r"choose from \['type', 'clip_eps_low'",
        ),
        (
            [{"at": 0, "loss": {"kl_coef": -0.5}}],
            ValueError,
            r"phases\[0\].loss .*kl_coef must be >= 0",
        ),
        (
            [{"at": 0, "loss": {"type": "dpo"}}],
            ValueError,
            r"phases\[0\].loss .*unknown loss type: 'dpo'",
        ),
        # valid alone, invalid cumulatively: dr_grpo needs max_tokens
        (
            [{"at": 0, "loss": {"max_tokens": 64}}, {"at": 9, "loss": {"max_tokens": None}}],
            ValueError,
            r"phases\[1\].loss .*aggregation='dr_grpo' needs LossConfig.max_tokens",
        ),
        ([PhaseConfig(at=True)], TypeError, r"phases\[0\].at must be an int"),
        ([PhaseConfig(at=0, loss=["kl_coef"])], TypeError, r"phases\[0\].loss must be a dict"),
        (["at 0"], TypeError, r"phases\[0\] must be a PhaseConfig or a dict"),
    ],
)
def test_validation_errors_name_the_key(phases, exc, match):
    base = LossConfig(aggregation="dr_grpo", max_tokens=8)
    with pytest.raises(exc, match=match):
        validate_phases(phases, base)


def test_no_phases_is_valid():
    validate_phases([], LossConfig())
    tracker = PhaseTracker([], LossConfig())
    assert tracker.changes(0) is None and tracker.current(100) is None
