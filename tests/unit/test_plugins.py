"""forge.plugins: resolving callables, built-in names and import strings, with checks."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pytest

from forge.config import config_to_dict
from forge.config.schema import config_from_dict
from forge.plugins import PluginSpec, Slot, Spec, describe, import_string
from forge.slots import ADVANTAGE, DATA_SOURCE, KL, REWARD, REWARD_AGGREGATOR

SLOT = Slot("scorer", {"double": "tests.unit.test_plugins:double"}, call=("x",))


def double(x: float, scale: float = 2.0) -> float:
    return scale * x


class Scaler:
    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, x):
        return self.scale * x


def test_forms_of_a_spec():
    assert SLOT.resolve("double")(3) == 6
    assert SLOT.resolve("tests.unit.test_plugins:double")(3) == 6
    assert SLOT.resolve({"fn": "double", "kwargs": {"scale": 3}})(3) == 9
    assert SLOT.resolve(PluginSpec("tests.unit.test_plugins:Scaler", {"scale": 4}))(2) == 8
    assert SLOT.resolve(lambda x: x + 1)(1) == 2
    bound = SLOT.resolve({"fn": "double", "kwargs": {"scale": 5}})
    assert isinstance(bound, functools.partial) and bound.keywords == {"scale": 5}


def test_errors_name_key_string_and_builtins():
    with pytest.raises(
        ValueError,
        match=r"^k: 'doubel' is not a built-in scorer \(did you mean "
        r"'double'\?\) nor an import string .*built-ins: double$",
    ):
        SLOT.resolve("doubel", key="k")
    with pytest.raises(
        ValueError, match=r"module 'nope_pkg.mod' failed to import \(ModuleNotFoundError"
    ):
        SLOT.resolve("nope_pkg.mod:f")
    with pytest.raises(ValueError, match=r"takes no keyword argument\(s\) \['scal'\]"):
        SLOT.resolve({"fn": "double", "kwargs": {"scal": 3}})
    with pytest.raises(ValueError, match=r"'tests.unit.test_plugins:Scaler'\(\) failed"):
        SLOT.resolve("tests.unit.test_plugins:Scaler")  # missing the required scale
    with pytest.raises(ValueError, match=r"a scorer is called as fn\(x\)"):
        SLOT.resolve(lambda: 0)
    with pytest.raises(ValueError, match=r"needs 'fn'"):
        SLOT.resolve({"function": "double"})
    with pytest.raises(ValueError, match=r"not a callable scorer"):
        SLOT.resolve("tests.unit.test_plugins:SLOT_VALUE")
    with pytest.raises(ValueError, match=r"must be a callable, a built-in name"):
        SLOT.resolve(42)
    with pytest.raises(ValueError, match=r"not an import string"):
        import_string("no_colon")


SLOT_VALUE = 3


@dataclass
class C:
    rewards: list[Spec] = field(default_factory=list)


def test_builtin_slots_resolve():
    needs = {"length": {"soft_limit": 5, "hard_limit": 10}, "reasoning_gym": {"name": "chain_sum"}}
    for name in REWARD.names():
        REWARD.resolve({"fn": name, "kwargs": needs[name]} if name in needs else name)
    for name in ADVANTAGE.names() + KL.names() + REWARD_AGGREGATOR.names():
        slot = {
            **dict.fromkeys(ADVANTAGE.names(), ADVANTAGE),
            **dict.fromkeys(KL.names(), KL),
            **dict.fromkeys(REWARD_AGGREGATOR.names(), REWARD_AGGREGATOR),
        }[name]
        assert callable(slot.resolve(name))
    factory = DATA_SOURCE.resolve({"fn": "jsonl", "kwargs": {"path": "x.jsonl"}})
    assert factory.keywords == {"path": "x.jsonl"}  # built later, in the actor


def test_config_round_trip_with_callables():
    cfg = C(rewards=[double, functools.partial(double, scale=3.0), "exact_match"])
    plain = config_to_dict(cfg)
    assert plain == {
        "rewards": [
            "tests.unit.test_plugins:double",
            {"fn": "tests.unit.test_plugins:double", "kwargs": {"scale": 3.0}},
            "exact_match",
        ]
    }
    back = config_from_dict(C, plain)
    assert back.rewards[1] == PluginSpec("tests.unit.test_plugins:double", {"scale": 3.0})
    assert REWARD_AGGREGATOR.resolve("pareto").__class__.__name__ == "ParetoRank"
    assert describe(Scaler(2)) == "tests.unit.test_plugins:Scaler"
