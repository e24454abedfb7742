"""Long decodes' float32 CPU products with weights laid out once per version for oneDNN.

A decode step multiplies a few dozen rows by every weight of the model. MKL's ``sgemm``
(what ``F.linear`` calls) re-lays-out each weight for its kernel on every call; at 32 rows
that copy is a large part of the product. oneDNN can take a weight already in its kernel's
layout (``torch.ops.mkldnn._reorder_linear_weight``), so the layout is paid once per weight
version instead of once per step. Laying the weights out costs about one pass over them,
so it pays only when a weight version decodes many steps: a 128-token generation, not the
main job's 16 (the measurements: docs/performance.md, "Long decodes on weights laid out once
per version").

``DecodePacker(model)`` prepares a float32 CPU model (its large ``nn.Linear`` layers, the
head excepted: ``forge/models/cpu_head.py`` runs that one); ``with packer.active(rows):``
around a decode step's forward makes those layers use laid-out weights when the step's rows
still have at least ``MIN_TOKENS`` tokens to go (or the layout for these weights is already
made). Outside that block, with autograd on, or under autocast the layers run ``F.linear``
as before. Layouts are keyed on each weight's storage and in-place version, and dropped by
``clear()`` (the engine calls it when its weights change). They cost a second copy of the
body's weights in memory while held. ``ENABLED = False`` turns it off (in-process A/B runs).
"""

from __future__ import annotations

import contextlib
import threading
import types

import torch
import torch.nn.functional as F

from forge.models import cpu_head
from forge.models.logprobs import output_head

MIN_TOKENS = 64  # tokens still to decode for the layout (~0.44 s) to pay (module docstring)
MIN_WEIGHT_ELEMENTS = 1 << 16  # smaller products gain nothing worth a second copy
BATCH_HINT = 64  # the rows oneDNN lays the weights out for (decode batches of 8-64)
ENABLED = True

_local = threading.local()  # .packer: the DecodePacker whose decode step is running


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    packer = getattr(_local, "packer", None)
    if packer is None or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
        return F.linear(x, self.weight, self.bias)
    if x.dtype != torch.float32 or x.device.type != "cpu" or type(x) is not torch.Tensor:
        return F.linear(x, self.weight, self.bias)
    return cpu_head.onednn_linear(x, packer.layout(self), self.bias)


def _usable(module: torch.nn.Module) -> bool:
    if type(module) is not torch.nn.Linear:
        return False
    w = module.weight
    return (
        w.device.type == "cpu"
        and w.dtype == torch.float32
        and type(w.data) is torch.Tensor
        and w.numel() >= MIN_WEIGHT_ELEMENTS
        and (module.bias is None or module.bias.dtype == torch.float32)
    )


def available() -> bool:
    """This torch build has the oneDNN ops the layouts need."""
    return cpu_head.available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class DecodePacker:
    """The laid-out weights of one model's decode steps (module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        head = output_head(model)
        self.layers: list[torch.nn.Linear] = []
        if ENABLED and available():
            for module in model.modules():
                if module is head or not _usable(module):
                    continue
                forward = module.__dict__.get("forward")
                if forward is None:
                    module.forward = types.MethodType(_forward, module)
                elif getattr(forward, "__func__", None) is not _forward:
                    continue  # another replacement: left alone
                self.layers.append(module)
        self._layouts: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}
        self.packs = 0  # layouts made so far (each a weight's copy): the cost's counter

    def __bool__(self) -> bool:
        return bool(self.layers)

    @property
    def holding(self) -> bool:
        """Layouts are held (for the weights as they are now, unless ``clear`` is due)."""
        return bool(self._layouts)

    def clear(self) -> None:
        """Drop every layout (the weights changed, or will)."""
        self._layouts.clear()

    def layout(self, module: torch.nn.Linear) -> torch.Tensor:
        """``module``'s weight in oneDNN's layout, made on first use for its current values."""
        w = module.weight
        key = (w.data_ptr(), w._version)
        held = self._layouts.get(id(module))
        if held is None or held[0] != key:
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), BATCH_HINT)
            held = self._layouts[id(module)] = (key, packed)
            self.packs += 1
        return held[1]

    @contextlib.contextmanager
    def active(self, tokens_left: int):
        """Within the block, the model's layers use layouts when ``tokens_left`` (the most any
        running row may still decode) is at least ``MIN_TOKENS`` or layouts are held."""
        use = bool(self.layers) and (tokens_left >= MIN_TOKENS or self.holding)
        if not use:
            yield False
            return
        _local.packer = self
        try:
            yield True
        finally:
            _local.packer = None
