"""The LM head's float32 product through oneDNN on CPU, where MKL's is slow.

PyTorch's CPU ``linear`` in float32 calls MKL's sgemm. At an LM head's shape (a few to a
thousand rows against a ``[49152, 576]`` weight) it runs well below the rate of the model's
other products; oneDNN's inner-product kernel, which PyTorch ships too, does the same
product faster, and the head is a large share of a small model's float32 generation (the
measurements: docs/performance.md, "The float32 LM head through oneDNN").

``use_onednn_head(model)`` makes a float32 CPU model's head use it, in the generator, the
reference model and a one-rank trainer alike (they then compute the same logits). Autograd
works: the backward is the two products ``linear``'s own backward runs. Heads it leaves
alone: small ones (under ``MIN_WEIGHT_ELEMENTS``; the gain is in large vocabularies and the
tiny test models keep their numbers), other types or devices, a head whose forward is
already replaced (the trainer's float32 head under autocast), and any head where the probe
disagrees with ``linear`` beyond float32 rounding. ``ENABLED = False`` turns it off
(in-process A/B runs).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from forge.models.logprobs import output_head

MIN_WEIGHT_ELEMENTS = 1 << 20  # 4 MB of float32: a real vocabulary, not a test model's
ENABLED = True


def available() -> bool:
    """This torch build has oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _product(
    x_nk: torch.Tensor, weight_vk: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x_nk, weight_vk, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    """``x @ weight.T`` forward in oneDNN; the backward is ``linear``'s."""

    @staticmethod
    def forward(ctx, x_nk: torch.Tensor, weight_vk: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x_nk, weight_vk)
        return _product(x_nk, weight_vk)

    @staticmethod
    def backward(ctx, grad_nv: torch.Tensor):
        x_nk, weight_vk = ctx.saved_tensors
        grad_x = grad_nv @ weight_vk if ctx.needs_input_grad[0] else None
        grad_w = grad_nv.t() @ x_nk if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors, any leading shape. ``weight``
    may be one laid out for oneDNN already (``forge.generation.packed_weights``: no grad)."""
    x_nk = x.reshape(-1, x.shape[-1])
    if not x_nk.is_contiguous():
        x_nk = x_nk.contiguous()
    if torch.is_grad_enabled() and (x_nk.requires_grad or weight.requires_grad):
        out_nv = _OneDnnLinear.apply(x_nk, weight)
        if bias is not None:
            out_nv = out_nv + bias
    else:  # generation, reference and old-logprob passes: no graph, nothing saved
        out_nv = _product(x_nk, weight, bias)
    return out_nv.view(*x.shape[:-1], weight.shape[0])


def _head_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    plain = type(x) is torch.Tensor and type(w.data) is torch.Tensor  # not a DTensor, say
    if not plain or x.dtype != torch.float32 or w.dtype != torch.float32:
        return F.linear(x, w, self.bias)
    if x.device.type != "cpu" or torch.is_autocast_enabled("cpu"):  # autocast picks the type
        return F.linear(x, w, self.bias)
    return onednn_linear(x, w)


def usable(head: torch.nn.Module | None) -> bool:
    """Whether ``head`` is a plain float32 CPU ``nn.Linear`` big enough to gain."""
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return False
    w = head.weight
    return (
        w.device.type == "cpu"
        and w.dtype == torch.float32
        and w.dim() == 2
        and w.numel() >= MIN_WEIGHT_ELEMENTS
        and available()
    )


@torch.no_grad()
def _agrees(head: torch.nn.Linear) -> bool:
    """oneDNN's product equals ``linear``'s on a probe, to float32 rounding."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, head.in_features, generator=gen)
    try:
        got = _product(x, head.weight)
    except RuntimeError:
        return False
    want = F.linear(x, head.weight)
    scale = float(want.abs().max()) + 1.0
    return got.shape == want.shape and bool((got - want).abs().max() <= 1e-4 * scale)


def use_onednn_head(model: torch.nn.Module) -> bool:
    """Compute ``model``'s LM head with oneDNN from now on (module docstring); returns
    whether it does. A multi-LoRA wrapper's base head counts as the head."""
    head = output_head(model)
    head = getattr(head, "base", head)  # forge.generation.multi_lora.MultiLoraLinear
    if not ENABLED or not usable(head):
        return False
    forward = head.__dict__.get("forward")
    if forward is not None:  # ours already, or another replacement (left alone)
        return getattr(forward, "__func__", None) is _head_forward
    if not _agrees(head):
        return False
    head.forward = types.MethodType(_head_forward, head)
    return True
