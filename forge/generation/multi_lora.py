"""Many LoRA adapters on one base model, chosen per batch row (``lora_mode: multi``).

Every adaptable linear layer (``TARGETS``) is wrapped once: the base layer stays as it is and
the wrapper adds, for each row of the batch, the update of the adapter *slot* that row uses::

    y[b] = base(x[b]) + (x[b] @ A[s_b].T) @ B[s_b].T        (B pre-scaled by alpha / rank)

``A`` is ``[slots, R, in]`` and ``B`` ``[slots, out, R]``, ``R`` the largest rank loaded
(smaller ones are zero-padded, which is exact); slot 0 is all zeros (the base model). A slot
holds one version of one adapter, so a request keeps its slot (and its weights) to the end
while a newer version loads into another one; ``free`` recycles a slot nobody uses. The
engine sets ``rows`` (one slot index per batch row) before every forward. Batches whose rows
are all on slot 0 skip the adapter math."""

from __future__ import annotations

import torch

from forge.weights.adapter import AdapterSpec

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


class MultiLoraLinear(torch.nn.Module):
    """A linear layer plus per-row LoRA updates read from ``slots`` (see the module doc)."""

    def __init__(self, base: torch.nn.Linear, slots: LoraSlots) -> None:
        super().__init__()
        self.base = base
        self.slots = slots
        self.A = torch.zeros(
            1, 1, base.in_features, dtype=base.weight.dtype, device=base.weight.device
        )
        self.B = torch.zeros(
            1, base.out_features, 1, dtype=base.weight.dtype, device=base.weight.device
        )

    @property
    def weight(self) -> torch.Tensor:  # tied-embedding checks and dtype lookups read it
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        rows = self.slots.rows
        if rows is None or not bool(rows.any()) or rows.shape[0] != x.shape[0]:
            return y
        a = self.A[rows]  # [b, R, in]
        b = self.B[rows]  # [b, out, R]
        flat = x.reshape(x.shape[0], -1, x.shape[-1])
        delta = torch.bmm(torch.bmm(flat, a.transpose(1, 2)), b.transpose(1, 2))
        return y + delta.reshape(y.shape)


class LoraSlots:
    """The adapter slots of one model (module docstring). Not thread-safe: load and free
    between forwards (the backend does, under its step lock)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules: dict[str, MultiLoraLinear] = {}
        self.rows: torch.Tensor | None = None
        self.spec: dict[int, AdapterSpec] = {}
        self.capacity = 1  # slots allocated (slot 0: the base)
        self.rank = 1
        self._free: list[int] = []
        for name, module in list(model.named_modules()):
            for child_name, child in list(module.named_children()):
                if child_name in TARGETS and isinstance(child, torch.nn.Linear):
                    wrapper = MultiLoraLinear(child, self)
                    setattr(module, child_name, wrapper)
                    self.modules[f"{name}.{child_name}" if name else child_name] = wrapper
        if not self.modules:
            raise ValueError(f"the model has none of the linear layers {TARGETS} to adapt")

    def set_rows(self, slots: list[int]) -> None:
        """The slot of each row of the next forward."""
        self.rows = torch.tensor(slots, dtype=torch.long) if any(slots) else None

    def _grow(self, capacity: int, rank: int) -> None:
        for m in self.modules.values():
            a = m.A.new_zeros(capacity, rank, m.A.shape[2])
            b = m.B.new_zeros(capacity, m.B.shape[1], rank)
            a[: m.A.shape[0], : m.A.shape[1]] = m.A
            b[: m.B.shape[0], :, : m.B.shape[2]] = m.B
            m.A, m.B = a, b  # whole-tensor swaps: a forward in flight reads old or new
        self.capacity, self.rank = capacity, rank

    def load(self, spec: AdapterSpec, tensors: dict[str, torch.Tensor]) -> int:
        """Write an adapter into a free slot; return the slot."""
        from forge.weights.adapter import adapter_key_parts

        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, t in tensors.items():
            module, ab = adapter_key_parts(key)
            name = module.removeprefix("base_model.model.")
            if name not in self.modules:
                raise ValueError(
                    f"adapter tensor {key!r}: this generator has no adaptable layer {name!r} "
                    f"(adaptable: {TARGETS})"
                )
            pairs.setdefault(name, {})[ab] = t
        slot = self._free.pop() if self._free else self.capacity
        if slot >= self.capacity or spec.rank > self.rank:
            self._grow(max(self.capacity, slot + 1), max(self.rank, spec.rank))
        scale = spec.alpha / spec.rank
        for name, m in self.modules.items():
            m.A[slot].zero_()
            m.B[slot].zero_()
            if name in pairs:
                a, b = pairs[name]["A"], pairs[name]["B"]
                m.A[slot, : a.shape[0]] = a.to(m.A.dtype)
                m.B[slot, :, : b.shape[1]] = (b.float() * scale).to(m.B.dtype)
        self.spec[slot] = spec
        return slot

    def free(self, slot: int) -> None:
        if slot and slot in self.spec:
            del self.spec[slot]
            self._free.append(slot)

    @property
    def used(self) -> int:
        """Slots holding an adapter."""
        return len(self.spec)
