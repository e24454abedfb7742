"""Training on token datums: the ``forward_backward`` / ``optim_step`` semantics of the Tinker
API, run on a trainer rank's model and optimizer (``TrainerCore``).

A datum is a plain dict (picklable, so it crosses the actor boundary as is)::

    {"tokens": [int, ...],                 # the model input, length L
     "inputs": {"target_tokens": array[L], "weights": array[L], ...}}

Position ``i`` predicts ``target_tokens[i]`` from ``tokens[: i + 1]``. The losses are sums over
tokens (no normalisation: callers scale with ``weights`` or ``advantages``), and gradients
add up over calls until ``optim_step`` applies and clears them:

- ``cross_entropy``: ``-sum(weights * logp(target))``; ``target_tokens`` and ``weights`` may
  also be ``[L, K]`` (soft targets: ``K`` tokens per position, each with its weight, e.g. a
  teacher's top-K probabilities, as the cookbook's sdft sends them): the loss is
  ``-sum_{i,k} weights[i, k] * logp(target_tokens[i, k] | tokens[: i + 1])``;
- ``importance_sampling``: ``-sum(exp(logp - logprobs) * advantages)``, ``logprobs`` being the
  sampler's;
- ``ppo``: ``-sum(min(r * A, clip(r, clip_low_threshold, clip_high_threshold) * A))``, the
  thresholds from ``loss_fn_config`` (default 0.8 and 1.2).

Each datum's output is ``{"logprobs": float32[L]}`` (``[L, K]`` for ``[L, K]`` targets: the
target tokens' logprobs at the weights before this call's update) and the metrics are
``loss:sum`` and ``tokens:sum``.

Temperature. The hosted Tinker service scores ``forward_backward`` (and
``compute_logprobs``) at temperature 1: neither takes a temperature, while its sampler
returns the logprobs it sampled with, of ``logits / T`` (confirmed by Tinker's maintainers
in thinking-machines-lab/tinker-cookbook#86; the cookbook therefore recommends T = 1 for
RL). Forge's ``/sample`` reports the same, so with T != 1 the ratio
``exp(logp_1 - logprobs_T)`` of ``importance_sampling`` / ``ppo`` is not 1 even on-policy,
exactly as on Tinker. Forge matches Tinker by default (T = 1) and adds one key Tinker lacks:
``loss_fn_config={"temperature": T}`` for ``importance_sampling`` and ``ppo`` scores the
targets at ``logits / T`` (also the returned ``logprobs``), so that samples drawn at T give
a ratio of exactly 1 at the sampling weights. ``cross_entropy`` (supervised) is always T = 1.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

LOSSES = ("cross_entropy", "importance_sampling", "ppo")
NEEDED = {
    "cross_entropy": ("target_tokens",),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
}
CONFIG_KEYS = {
    "cross_entropy": (),
    "importance_sampling": ("temperature",),
    "ppo": ("clip_low_threshold", "clip_high_threshold", "temperature"),
}


class DatumError(ValueError):
    """A datum, loss name or loss config the trainer cannot use (the caller's mistake)."""


def check_request(datums: list[dict], loss_fn: str, config: dict | None) -> None:
    """Raise ``DatumError`` naming the problem before any compute runs."""
    if loss_fn not in LOSSES:
        raise DatumError(
            f"loss_fn {loss_fn!r} is not supported by this server; supported: {', '.join(LOSSES)}"
        )
    unknown = set(config or {}) - set(CONFIG_KEYS[loss_fn])
    if unknown:
        raise DatumError(
            f"loss_fn_config keys {sorted(unknown)} are not used by {loss_fn!r} "
            f"(it takes {list(CONFIG_KEYS[loss_fn]) or 'none'})"
        )
    temperature = (config or {}).get("temperature", 1.0)
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise DatumError(f"loss_fn_config temperature must be a number > 0, got {temperature!r}")
    if not datums:
        raise DatumError("forward_backward got no data")
    widths = set()
    for i, d in enumerate(datums):
        n = len(d["tokens"])
        if n == 0:
            raise DatumError(f"datum {i} has an empty model_input")
        for key in NEEDED[loss_fn]:
            if key not in d["inputs"]:
                raise DatumError(f"datum {i}: loss {loss_fn!r} needs loss_fn_inputs[{key!r}]")
        for key, arr in d["inputs"].items():
            shape = np.shape(arr)
            if len(shape) == 2 and loss_fn == "cross_entropy" and key in SOFT_KEYS:
                if shape[0] != n:
                    raise DatumError(
                        f"datum {i}: loss_fn_inputs[{key!r}] has shape {list(shape)} for a "
                        f"model_input of {n} tokens; soft targets are [{n}, K]"
                    )
                continue
            if len(shape) > 1:
                raise DatumError(
                    f"datum {i}: loss_fn_inputs[{key!r}] has shape {list(shape)}; only "
                    f"cross_entropy's {' and '.join(SOFT_KEYS)} may be [N, K] (soft targets), "
                    "every other input is one value per token"
                )
            if np.asarray(arr).reshape(-1).shape[0] != n:
                raise DatumError(
                    f"datum {i}: loss_fn_inputs[{key!r}] has {np.asarray(arr).size} values "
                    f"for a model_input of {n} tokens; they must be the same length"
                )
        if loss_fn == "cross_entropy":
            shapes = {k: np.shape(d["inputs"][k]) for k in SOFT_KEYS if k in d["inputs"]}
            if len(set(shapes.values())) > 1:
                raise DatumError(
                    f"datum {i}: target_tokens and weights must have the same shape, got "
                    + ", ".join(f"{k} {list(s)}" for k, s in shapes.items())
                )
            widths.add(_width(d))
    if len(widths) > 1:
        raise DatumError(
            "forward_backward: every datum of a call has the same kind of targets: one token "
            f"per position or K per position with one K; got K = {sorted(widths)} (0: one)"
        )


SOFT_KEYS = ("target_tokens", "weights")  # cross_entropy's inputs that may be [N, K]


def _width(datum: dict) -> int:
    """``K`` of a datum's ``[N, K]`` soft targets (0: one target per position)."""
    shape = np.shape(datum["inputs"]["target_tokens"])
    return shape[1] if len(shape) == 2 else 0


def _pad(datums: list[dict], key: str | None, dtype, device) -> torch.Tensor:
    """``[B, T]`` (``[B, T, K]`` for ``[N, K]`` inputs), zero past each datum's length."""
    rows = [
        np.asarray(d["tokens"]) if key is None else np.asarray(d["inputs"][key]) for d in datums
    ]
    rows = [r if r.ndim == 2 else r.reshape(-1) for r in rows]
    width = max(len(r) for r in rows)
    out = torch.zeros(len(rows), width, *rows[0].shape[1:], dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.as_tensor(r, dtype=dtype)
    return out.to(device)


def target_logprobs(
    model: torch.nn.Module, datums: list[dict], device, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, T]`` (``[B, T, K]`` for soft targets) logprobs of each datum's target tokens
    under ``logits / temperature`` (with grad if enabled) and the ``[B, T]`` 0/1 mask of real
    positions."""
    ids_bt = _pad(datums, None, torch.long, device)
    mask_bt = torch.zeros_like(ids_bt)
    for i, d in enumerate(datums):
        mask_bt[i, : len(d["tokens"])] = 1
    targets_bt = _pad(datums, "target_tokens", torch.long, device)
    logits_btv = model(input_ids=ids_bt, attention_mask=mask_bt).logits.float() / temperature
    logp_btv = torch.log_softmax(logits_btv, dim=-1)
    if targets_bt.dim() == 3:  # [B, T, K] soft targets
        lp_btk = logp_btv.gather(-1, targets_bt)
        return lp_btk * mask_bt.unsqueeze(-1), mask_bt.float()
    lp_bt = logp_btv.gather(-1, targets_bt.unsqueeze(-1)).squeeze(-1)
    return lp_bt * mask_bt, mask_bt.float()


def datum_loss(
    loss_fn: str, lp_bt: torch.Tensor, mask_bt: torch.Tensor, datums: list[dict], config: dict
) -> torch.Tensor:
    """The summed loss of ``loss_fn`` (module docstring) over the real positions."""
    device = lp_bt.device
    if loss_fn == "cross_entropy":
        if "weights" in datums[0]["inputs"]:
            w_bt = _pad(datums, "weights", torch.float32, device)
        else:
            w_bt = torch.ones_like(lp_bt)
        if lp_bt.dim() == 3:  # soft targets: [B, T, K]
            return -(w_bt * lp_bt * mask_bt.unsqueeze(-1)).sum()
        return -(w_bt * lp_bt * mask_bt).sum()
    old_bt = _pad(datums, "logprobs", torch.float32, device)
    adv_bt = _pad(datums, "advantages", torch.float32, device)
    ratio_bt = torch.exp((lp_bt - old_bt).clamp(-20.0, 20.0)) * mask_bt
    if loss_fn == "importance_sampling":
        return -(ratio_bt * adv_bt).sum()
    low = float(config.get("clip_low_threshold", 0.8))
    high = float(config.get("clip_high_threshold", 1.2))
    clipped_bt = ratio_bt.clamp(low, high)
    return -(torch.minimum(ratio_bt * adv_bt, clipped_bt * adv_bt) * mask_bt).sum()


def forward_backward(
    core, datums: list[dict], loss_fn: str, config: dict | None, forward_only: bool
) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Forward (and backward unless ``forward_only``) ``datums`` on ``core``'s model: the
    per-datum target logprobs and the metrics. Gradients add to any already there."""
    check_request(datums, loss_fn, config)
    t0 = time.perf_counter()
    model = core.model
    with torch.set_grad_enabled(not forward_only):
        temperature = float((config or {}).get("temperature", 1.0))
        lp_bt, mask_bt = target_logprobs(model, datums, core.device, temperature)
        loss = datum_loss(loss_fn, lp_bt, mask_bt, datums, config or {})
        if not forward_only:
            loss.backward()
    outputs = [
        {"logprobs": lp_bt[i, : len(d["tokens"])].detach().float().cpu().numpy()}
        for i, d in enumerate(datums)
    ]
    metrics = {
        "loss:sum": float(loss.detach()),
        "tokens:sum": float(mask_bt.sum()),
        "seconds:max": time.perf_counter() - t0,
    }
    return outputs, metrics


ADAM_KEYS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


def optim_step(core, adam: dict[str, Any]) -> dict[str, float]:
    """Apply the accumulated gradients with these Adam parameters (every ``ADAM_KEYS`` key;
    ``grad_clip_norm`` 0 means no clipping), then clear them."""
    unknown = set(adam) - set(ADAM_KEYS)
    if unknown:
        raise DatumError(
            f"optim_step: unknown Adam parameters {sorted(unknown)}; known: {ADAM_KEYS}"
        )
    for group in core.optimizer.param_groups:
        group["lr"] = float(adam["learning_rate"])
        group["betas"] = (float(adam["beta1"]), float(adam["beta2"]))
        group["eps"] = float(adam["eps"])
        group["weight_decay"] = float(adam["weight_decay"])
    params = [p for p in core.model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.tensor(0.0)
    if adam["grad_clip_norm"] and params:
        torch.nn.utils.clip_grads_with_norm_(params, float(adam["grad_clip_norm"]), norm)
    core.optimizer.step()
    core.optimizer.zero_grad(set_to_none=True)
    core.step += 1
    return {
        "grad_norm": float(norm),
        "learning_rate": float(adam["learning_rate"]),
        "step": float(core.step),
    }
