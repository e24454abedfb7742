"""A moving reference in real processes: the Trainer pushes, ReferenceModels pull and apply."""

from __future__ import annotations

import pytest
import torch

from forge.training import ReferenceConfig, ReferenceCore
from forge.weights import WeightStore, WeightTransportConfig, build_transport, run_weights_prefix


def _response(lp_bt: torch.Tensor, batch) -> torch.Tensor:
    return lp_bt[batch.response_mask_bt.bool()]


def test_core_update_rules_skips_and_errors_in_process(tiny_model, tmp_path):
    on_disk = WeightTransportConfig(type="safetensors_dir", root=str(tmp_path))
    store = WeightStore(build_transport(on_disk))
    initial = ReferenceCore(ReferenceConfig(model=tiny_model)).model.state_dict()
    policy = {n: t + 1.0 for n, t in initial.items()}
    handles = {v: store.push(policy, v) for v in (1, 2)}

    frozen = ReferenceCore(ReferenceConfig(model=tiny_model))
    assert frozen.update_weights(1, handles[1]) == 0 and frozen.update_weights() == 0  # "none"

    ref = ReferenceCore(
        ReferenceConfig(
            model=tiny_model,
            update={"type": "ema", "decay": 0.5, "every": 2},
            weights=on_disk,
        )
    )
    name = "model.norm.weight"
    assert ref.update_weights(1) == 0 and ref.seen_version == 1  # skipped: nothing pulled
    torch.testing.assert_close(ref.model.state_dict()[name], initial[name], rtol=0, atol=0)
    assert ref.update_weights() == 2  # the latest pushed, looked up through cfg.weights
    torch.testing.assert_close(ref.model.state_dict()[name], initial[name] + 0.5)
    with pytest.raises(ValueError, match="version=3 but a handle for version 1"):
        ref.update_weights(3, handles[1])
    with pytest.raises(ValueError, match="versions only move forward"):
        ref.update_weights(1, handles[1])
    with pytest.raises(ValueError, match="'safetensors_dir' needs root"):
        ReferenceConfig(model=tiny_model, weights={"type": "safetensors_dir"})
    # No shm prefix: versions are looked up at the run's publication location.
    run_default = ReferenceCore(ReferenceConfig(model=tiny_model, update={"type": "reset"}))
    assert run_default._transport_or_raise().prefix == run_weights_prefix()
    store.close()
