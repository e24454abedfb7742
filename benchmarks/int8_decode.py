"""int8 rollouts on CPU, measured and not adopted: decode speed and the policy mismatch.

    python -m benchmarks.int8_decode [--repeats 2]

The question (issue 33): would a generator that runs the body's products in int8 close the
gen-heavy 4x-TRL gap on a CPU without native bf16? SmolLM2-135M-Instruct (converted once),
float32, 2 threads, Forge's ``HFEngine`` alone on the gen-heavy batch (4 prompts x 8 samples,
128 sampled tokens, ``ignore_eos``), alternating two engines on one model:

- ``fp32``: the engine as it is (the body's products on oneDNN layouts, the head on oneDNN);
- ``int8``: the body's ``nn.Linear`` layers patched to fbgemm's int8 kernels. Weights: 7-bit
  symmetric per output channel (AVX2's ``vpmaddubsw`` saturates int16 sums of 8 x 8 bits);
  activations: 8 bits per row (each row over its own magnitude, so rows never couple);
  SmoothQuant (alpha 0.5) on per-channel activation ranges measured on a fixed calibration
  text at the weights being packed. Each repetition is a new weight version, so the int8
  run pays its calibration and packing, as every step of a run would.

Prints each run's total, its first step (prefill, and for int8 the packing) and its median
decode step, then the policy mismatch of each engine's samples: the k3 KL estimate
``mismatch_kl`` (``forge.training.trainer_core.mismatch_metrics``) between the logprobs the
engine sampled with and the float32 model's own, teacher-forced.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

ALPHA = 0.5
CALIBRATION = (
    (
        "Write two sentences about the sea.",
        "The sea is wide and restless, and it carries light and salt to every shore.",
    ),
    (
        "What is 47 + 38? Think step by step.",
        "First add the tens: 40 + 30 = 70. Then the ones: 7 + 8 = 15. So 70 + 15 = 85.",
    ),
    (
        "Write a Python function that reverses a list.",
        "def reverse(items):\n    return items[::-1]\n\nThis returns a new list in reverse.",
    ),
)


def pack(weight, smooth):
    """``weight * smooth`` (per input channel) as fbgemm's packed 7-bit weight."""
    import torch

    w = weight.detach().float() * smooth
    scale = (w.abs().amax(dim=1) / 63.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-63, 63).to(torch.int8)
    zeros = torch.zeros(w.shape[0], dtype=torch.long)
    qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zeros, 0)
    return torch.ops.quantized.linear_prepack(qw, None)


def int8_forward(self, x):
    """The patched ``nn.Linear.forward``: 8-bit activations per row, the layer's packing."""
    import torch

    shape = x.shape
    x2 = x.reshape(-1, shape[-1]) * self._inv_smooth
    mag = x2.abs().amax(dim=1, keepdim=True).clamp_min_(1e-30)
    y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        x2 / mag, 1.0 / 127.0, 128, self._packed
    )
    return y.mul_(mag).reshape(*shape[:-1], y.shape[-1])


def quantize(model, layers, calibration_ids) -> None:
    """Calibrate (float32 forward, per-channel input magnitudes) and pack every layer."""
    import torch

    amax = {}

    def record(module, args, _out):
        x = args[0].detach()
        amax[module] = x.reshape(-1, x.shape[-1]).abs().amax(dim=0)

    for m in layers:
        m.__dict__.pop("forward", None)
    hooks = [m.register_forward_hook(record) for m in layers]
    with torch.inference_mode():
        model(input_ids=calibration_ids)
    for h in hooks:
        h.remove()
    for m in layers:
        w_amax = m.weight.detach().abs().amax(dim=0).clamp_min(1e-5)
        smooth = (amax[m].clamp_min(1e-5) ** ALPHA / w_amax ** (1 - ALPHA)).clamp_min(1e-5)
        m._packed, m._inv_smooth = pack(m.weight, smooth), 1.0 / smooth
        m.forward = types.MethodType(int8_forward, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from benchmarks.real_e2e import SETUPS
    from forge.generation.hf_engine import HFEngine
    from forge.models import load_model, load_tokenizer
    from forge.models.gguf import resolve_model
    from forge.models.logprobs import gather_logprobs, output_head
    from forge.training.trainer_core import mismatch_metrics
    from forge.types import SamplingParams

    torch.set_num_threads(2)
    model_dir = resolve_model("smollm2-135m-instruct")
    model, tok = load_model(model_dir, dtype="float32"), load_tokenizer(model_dir)
    turns = [
        m
        for q, a in CALIBRATION
        for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
    ]
    text = tok.apply_chat_template(turns, tokenize=False)
    calibration_ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
    head = output_head(model)
    layers = [m for m in model.modules() if type(m) is torch.nn.Linear and m is not head]
    rows = SETUPS["gen-heavy"].rows(4, 0)
    params = SamplingParams(n=8, max_tokens=128, seed=1, ignore_eos=True)
    engine = HFEngine(model, tok, max_batch_size=64)  # patches the layers for oneDNN layouts
    fp32_forwards = {m: m.__dict__.get("forward") for m in layers}

    def run(name: str):
        engine.version += 1  # a new weight version: layouts (and the int8 packing) again
        wall = time.perf_counter()
        if name == "int8":
            quantize(model, layers, calibration_ids)
        else:
            for m in layers:
                m.forward = fp32_forwards[m]
        for r in rows:
            engine.add_request(r["prompt"], params)
        steps, out = [], {}
        while engine.has_work():
            t = time.perf_counter()
            out.update(engine.step())
            steps.append(time.perf_counter() - t)
        total = time.perf_counter() - wall
        first = total - sum(steps[1:])
        print(
            f"[int8_decode] {name}: {total:.2f} s, first step (with any packing) "
            f"{first:.2f} s, median decode step {1000 * statistics.median(steps[1:]):.0f} "
            "ms",
            flush=True,
        )
        return total, statistics.median(steps[1:]), [c for k in sorted(out) for c in out[k]]

    @torch.inference_mode()
    def mismatch(completions) -> dict:
        for m in layers:
            m.forward = fp32_forwards[m]
        lp, gen = [], []
        for c in completions:
            ids = torch.tensor([list(c.prompt_ids) + list(c.token_ids)])
            logits = model(input_ids=ids).logits[:, len(c.prompt_ids) - 1 : -1].float()
            lp.append(gather_logprobs(logits, torch.tensor([c.token_ids]))[0])
            gen.append(torch.tensor(c.logprobs))
        width = max(len(x) for x in lp)
        pad = lambda xs: torch.stack([F.pad(x, (0, width - len(x))) for x in xs])  # noqa: E731
        mask = pad([torch.ones(len(x)) for x in lp])
        return mismatch_metrics(pad(lp), pad(gen), mask)

    results: dict[str, list] = {"fp32": [], "int8": []}
    run("fp32")  # warm-up
    for _ in range(args.repeats):
        for name in results:
            results[name].append(run(name))
    for name, runs in results.items():
        m = mismatch(runs[-1][2])
        print(
            f"{name}: median total {statistics.median(r[0] for r in runs):.2f} s, median "
            f"decode step {1000 * statistics.median(r[1] for r in runs):.0f} ms, "
            f"mismatch_kl {m['mismatch_kl']:.5f}, logprob_gap {m['logprob_gap']:.4f}"
        )


if __name__ == "__main__":
    main()
