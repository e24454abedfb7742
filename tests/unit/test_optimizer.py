"""``build_optimizer``: AdamW with PyTorch's fused kernel where it applies, the same update."""

import torch

from forge.training.schedule import _can_fuse, build_optimizer
from forge.training.trainer_config import OptimizerConfig


def _params(seed: int) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in (7, 64, 3)]


def test_plain_parameters_get_the_fused_kernel_and_the_foreach_update():
    cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    fused_p, ref_p = _params(0), _params(0)
    fused = build_optimizer(fused_p, cfg)
    ref = torch.optim.AdamW(ref_p, lr=1e-2, weight_decay=0.1, foreach=True)
    assert fused.defaults["fused"] is True
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        for a, b in zip(fused_p, ref_p):
            g = torch.randn(a.shape, generator=gen)
            a.grad, b.grad = g.clone(), g.clone()
        fused.step()
        ref.step()
    for a, b, start in zip(fused_p, ref_p, _params(0)):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
        assert not torch.allclose(a, start)  # five steps moved it


def test_parameter_groups_fuse_and_devices_without_the_kernel_do_not():
    groups = [{"params": _params(0)}, {"params": _params(1), "lr": 1e-3}]
    assert build_optimizer(groups, OptimizerConfig()).defaults["fused"] is True
    assert not _can_fuse([torch.nn.Parameter(torch.empty(3, device="meta"))])
    assert not _can_fuse([])
