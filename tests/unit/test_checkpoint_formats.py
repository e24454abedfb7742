"""What checkpoints hold: plain data and tensors only, so that loading them unpickles no code."""

from __future__ import annotations

import os
import pickle
import random

import numpy as np
import pytest
import torch

from forge.run.checkpoint import plain
from forge.training.trainer_checkpoint import (
    UnsafeCheckpointError,
    rng_state,
    safe_load,
    set_rng_state,
)


def test_plain_converts_numpy_and_names_what_it_cannot_keep():
    state = {
        "a": [1, 2.5, "x", None],
        "b": (np.int64(3), np.float32(0.5)),
        "c": np.arange(3),
        "d": {"e": [np.array([1.0])]},
    }
    out = plain(state, "state")
    assert out["a"] == [1, 2.5, "x", None] and out["b"] == (3, 0.5)
    assert type(out["b"][0]) is int and torch.equal(out["c"], torch.arange(3))
    assert isinstance(out["d"]["e"][0], torch.Tensor)

    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"state\['buffer'\]\[1\] is a .*Opaque"):
        plain({"buffer": [1, Opaque()]}, "state")


def test_rng_state_round_trips_through_a_weights_only_load(tmp_path):
    torch.save(rng_state(), tmp_path / "rng.pt")
    draws = [random.random(), float(np.random.rand()), float(torch.rand(()))]
    set_rng_state(safe_load(tmp_path / "rng.pt"))
    assert [random.random(), float(np.random.rand()), float(torch.rand(()))] == draws


def test_an_older_rng_file_with_a_numpy_array_still_loads(tmp_path):
    old = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    torch.save(old, tmp_path / "rng.pt")
    x = np.random.rand(2)
    set_rng_state(safe_load(tmp_path / "rng.pt"))
    assert (np.random.rand(2) == x).all()


class _Runs:
    def __reduce__(self):
        return (os.getcwd, ())


def test_a_pickle_that_names_code_is_refused(tmp_path):
    torch.save({"x": _Runs()}, tmp_path / "state.pt")
    with pytest.raises(UnsafeCheckpointError, match="state.pt: not loaded.*it names posix.getcwd"):
        safe_load(tmp_path / "state.pt")
    assert issubclass(UnsafeCheckpointError, pickle.UnpicklingError)
