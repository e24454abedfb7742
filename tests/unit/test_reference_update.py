"""Reference update rules on real tensors, with hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from forge.config.schema import config_from_dict
from forge.training import ReferenceConfig
from forge.training.reference_update import (
    ReferenceUpdateConfig,
    apply_update_,
    ema_update_,
    should_update,
)


def _t(*values: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_ema_three_updates_by_hand():
    # decay 0.75: ref <- 0.75 * ref + 0.25 * policy, all values exact in binary.
    ref = {"w": _t(4.0, -8.0), "b": _t(1.0)}
    rule = ReferenceUpdateConfig(type="ema", decay=0.75)
    policies = [
        {"w": _t(0.0, 8.0), "b": _t(5.0)},  # w: 3, -6+2=-4     b: 0.75+1.25=2
        {"w": _t(7.0, 0.0), "b": _t(2.0)},  # w: 2.25+1.75=4, -3  b: 1.5+0.5=2
        {"w": _t(4.0, 1.0), "b": _t(-2.0)},  # w: 3+1=4, -2.25+0.25=-2  b: 1.5-0.5=1
    ]
    expected = [((3.0, -4.0), 2.0), ((4.0, -3.0), 2.0), ((4.0, -2.0), 1.0)]
    w_storage = ref["w"].data_ptr()
    for version, (policy, (w, b)) in enumerate(zip(policies, expected), start=1):
        assert apply_update_(rule, ref, policy, version) is True
        assert torch.equal(ref["w"], _t(*w)) and torch.equal(ref["b"], _t(b)), version
    assert ref["w"].data_ptr() == w_storage  # in place


def test_every_two_skips_odd_versions():
    rule = ReferenceUpdateConfig(type="ema", decay=0.5, every=2)
    assert [should_update(rule, v) for v in range(5)] == [False, False, True, False, True]
    ref = {"w": _t(0.0)}
    changed = [apply_update_(rule, ref, {"w": _t(8.0)}, v) for v in (1, 2, 3, 4)]
    assert changed == [False, True, False, True]
    assert torch.equal(ref["w"], _t(6.0))  # 0 -> 4 (v2) -> 6 (v4); v1, v3 skipped


def test_reset_copies_exactly_every_k_versions():
    rule = ReferenceUpdateConfig(type="reset", every=3)
    ref = {"w": torch.zeros(3, dtype=torch.bfloat16)}
    policy = {"w": torch.tensor([0.1, -2.5, 1e-3], dtype=torch.bfloat16)}
    assert not apply_update_(rule, ref, policy, 2)
    assert torch.equal(ref["w"], torch.zeros(3, dtype=torch.bfloat16))
    assert apply_update_(rule, ref, policy, 3)
    assert torch.equal(ref["w"], policy["w"]) and ref["w"].data_ptr() != policy["w"].data_ptr()


def test_none_never_changes_anything():
    rule = ReferenceUpdateConfig()
    ref = {"w": _t(1.0)}
    assert rule.type == "none" and not should_update(rule, 5)
    assert not apply_update_(rule, ref, {"w": _t(9.0)}, 5)
    assert torch.equal(ref["w"], _t(1.0))


def test_bf16_reference_blends_in_fp32_and_rounds_once():
    ulp = 2.0**-7  # bf16 spacing in [1, 2)
    # decay 0.25 towards one ulp up: 0.25 * 1 + 0.75 * (1 + ulp) = 1 + 0.75 ulp -> rounds up.
    ref = {"w": _t(1.0, dtype=torch.bfloat16)}
    ema_update_(ref, {"w": _t(1.0 + ulp)}, 0.25)  # an fp32 policy is fine too
    assert ref["w"].dtype == torch.bfloat16 and ref["w"].item() == 1.0 + ulp
    # decay 0.9: 1 + 0.1 ulp rounds back to 1: the documented loss of small bf16 steps.
    ref = {"w": _t(1.0, dtype=torch.bfloat16)}
    ema_update_(ref, {"w": _t(1.0 + ulp, dtype=torch.bfloat16)}, 0.9)
    assert ref["w"].item() == 1.0


def test_tied_weights_are_blended_once():
    shared = _t(2.0, 4.0)
    ref = {"embed.weight": shared, "lm_head.weight": shared, "norm": _t(1.0)}
    policy = {"embed.weight": _t(0.0, 0.0), "lm_head.weight": _t(0.0, 0.0), "norm": _t(3.0)}
    ema_update_(ref, policy, 0.5)
    assert torch.equal(shared, _t(1.0, 2.0))  # once: 0.5 * (2, 4); twice would give (0.5, 1)
    assert torch.equal(ref["norm"], _t(2.0))


def test_integer_buffers_are_copied():
    ref = {"w": _t(0.0), "count": torch.tensor([1], dtype=torch.long)}
    ema_update_(ref, {"w": _t(2.0), "count": torch.tensor([7], dtype=torch.long)}, 0.5)
    assert ref["count"].item() == 7 and ref["w"].item() == 1.0


def test_name_and_shape_mismatches_are_errors_naming_them():
    ref = {"a": _t(1.0), "b": _t(1.0)}
    with pytest.raises(ValueError, match=r"missing from the policy \['b'\].*unexpected .*\['c'\]"):
        ema_update_(ref, {"a": _t(1.0), "c": _t(1.0)}, 0.5)
    rule = ReferenceUpdateConfig(type="reset")
    with pytest.raises(ValueError, match=r"'a' is \[2\] in the policy but \[1\]"):
        apply_update_(rule, ref, {"a": _t(1.0, 2.0), "b": _t(1.0)}, 1)
    assert torch.equal(ref["a"], _t(1.0))  # checked before anything was written


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"type": "polyak"}, r"unknown reference update type 'polyak'; choose one of \('none'"),
        ({"type": "ema", "decay": 1.0}, r"decay must be in \[0, 1\)"),
        ({"type": "ema", "decay": -0.1}, r"decay must be in \[0, 1\)"),
        ({"type": "reset", "every": 0}, r"every must be an int >= 1"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReferenceUpdateConfig(**kwargs)


def test_reference_config_nests_the_update_rule_from_yaml():
    cfg = config_from_dict(
        ReferenceConfig,
        {"model": "m", "update": {"type": "ema", "decay": 0.9, "every": 2}},
        source="ref.yaml",
    )
    assert cfg.update == ReferenceUpdateConfig(type="ema", decay=0.9, every=2)
    assert ReferenceConfig(model="m").update.type == "none"
    assert ReferenceConfig(model="m", update={"type": "reset"}).update.type == "reset"
    with pytest.raises(ValueError, match="update.decai"):
        config_from_dict(ReferenceConfig, {"model": "m", "update": {"decai": 0.9}})
    with pytest.raises(
        ValueError, match=r"update: .*ReferenceUpdateConfig.type: unknown reference update type 'x'"
    ):
        config_from_dict(ReferenceConfig, {"model": "m", "update": {"type": "x"}})
    with pytest.raises(TypeError, match="ReferenceConfig.update must be a ReferenceUpdateConfig"):
        ReferenceConfig(model="m", update="ema")


def halfway_rule(ref_sd, policy_sd, version):
    """A user rule: move the reference half-way to the policy on odd versions only."""
    if version % 2 == 0:
        return False
    for name, t in ref_sd.items():
        t.copy_(0.5 * (t + policy_sd[name]))
    return True


def test_a_user_rule_by_import_string():
    rule = ReferenceUpdateConfig(type="tests.unit.test_reference_update:halfway_rule")
    ref = {"w": torch.tensor([0.0, 2.0])}
    pol = {"w": torch.tensor([4.0, 4.0])}
    assert apply_update_(rule, ref, pol, 1) and ref["w"].tolist() == [2.0, 3.0]
    assert not apply_update_(rule, ref, pol, 2) and ref["w"].tolist() == [2.0, 3.0]
    with pytest.raises(ValueError, match=r"ReferenceUpdateConfig.type: .*has no attribute"):
        ReferenceUpdateConfig(type="tests.unit.test_reference_update:nope")
