"""Full fine-tuning against LoRA on the CPU demo's task, in real processes.

Each variant is one ``forge run --config apps/sumdigits/cpu.yaml preset=<p> seed=<s> ...``
(SFT, then GRPO) in a fresh cache. While it runs, every process of the run is polled for its
peak resident memory (``VmHWM``), attributed by the mesh it hosts (``FORGE_MESH``: Trainer,
Generator, ...). Afterwards the run directory gives the SFT time and loss, the RL step time,
the weight-push bytes and time, and held-out accuracy after SFT and after RL.

    python -m benchmarks.lora_vs_full --preset small --seeds 0 1 -- rl.steps=150

Variants: ``full`` (the demo's learning rates); ``lora-rl`` (full SFT, then GRPO with LoRA of
rank ``--rank`` on every linear layer including ``lm_head``, its learning rate x
``--lora-lr-scale``: LoRA as it is used, on a model that already knows the format); ``lora``
(LoRA in both stages, both learning rates scaled: the randomly initialised base must then
learn everything through the adapters) and ``lora-same-lr`` (LoRA in both stages at the full
fine-tuning learning rates). ``--out`` keeps the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from forge.observability import read_jsonl

REPO = Path(__file__).resolve().parents[1]
CONFIG = "apps/sumdigits/cpu.yaml"
SFT_LR, RL_LR = 1.0e-3, 1.0e-4  # the demo's (apps/sumdigits/cpu.yaml)
TARGETS = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"


def variant_overrides(name: str, rank: int, lr_scale: float) -> list[str]:
    """The command-line overrides that make a variant out of the demo's config."""
    if name == "full":
        return []
    scale = 1.0 if name == "lora-same-lr" else lr_scale
    stages = (("rl", RL_LR),) if name == "lora-rl" else (("sft", SFT_LR), ("rl", RL_LR))
    out = []
    for stage, lr in stages:
        out += [
            f"{stage}.trainer.lora.rank={rank}",
            f"{stage}.trainer.lora.alpha={2 * rank}",
            f"{stage}.trainer.lora.target_modules={TARGETS}",
            f"{stage}.trainer.optimizer.lr={lr * scale:g}",
        ]
    return out


class PeakMemory:
    """Polls the process tree under ``root`` for each mesh's peak RSS (MiB) until stopped."""

    def __init__(self, root: int, interval: float = 0.5):
        self.root, self.interval = root, interval
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return self.peak

    def _children(self) -> list[int]:
        kids: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                kids.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.root]
        while todo:
            p = todo.pop()
            out.append(p)
            todo += kids.get(p, [])
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for pid in self._children():
                try:
                    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                mesh = next((e[11:].decode() for e in env if e.startswith(b"FORGE_MESH=")), "")
                role = re.sub(r"(-r\d+)?-\d+$", "", mesh) or (
                    "controller" if pid == self.root else ""
                )
                m = re.search(r"VmHWM:\s+(\d+) kB", status)
                if role and m:
                    self.peak[role] = max(self.peak.get(role, 0.0), int(m.group(1)) / 1024)


def _rows(path: Path) -> list[dict]:
    return read_jsonl(path)


def run_variant(name: str, preset: str, seed: int, extra: list[str], a) -> dict:
    """One run of the demo as ``name``; its measurements as a flat dict."""
    with tempfile.TemporaryDirectory(prefix="forge-lora-vs-full-") as tmp:
        run = Path(tmp) / "run"
        env = {**os.environ, "FORGE_CACHE_DIR": str(Path(tmp) / "cache")}
        cmd = [
            sys.executable,
            "-m",
            "forge.cli",
            "run",
            "--config",
            CONFIG,
            "--run-dir",
            str(run),
            f"preset={preset}",
            f"seed={seed}",
            "rl.eval.every=0",
            *variant_overrides(name, a.rank, a.lora_lr_scale),
            *extra,
        ]
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        mem = PeakMemory(proc.pid)
        try:
            out, err = proc.communicate(timeout=a.timeout)
        finally:
            peak = mem.stop()
            if proc.poll() is None:
                proc.kill()
        if proc.returncode != 0:
            raise RuntimeError(f"{name} seed {seed} failed:\n{out[-2000:]}\n{err[-2000:]}")
        last = [ln for ln in out.splitlines() if ln.startswith("heldout_accuracy=")][-1]
        summary = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", last)}
        sft = [r for r in _rows(run / "sft" / "metrics.jsonl") if "sft/loss" in r]
        rl = [r for r in _rows(run / "rl" / "metrics.jsonl") if "train/loss" in r]
        pushes = [r for r in rl if "weights/push_bytes" in r]

        def med(rows: list[dict], key: str) -> float:
            xs = [r[key] for r in rows if key in r]
            return statistics.median(xs) if xs else float("nan")

        return {
            "variant": name,
            "preset": preset,
            "seed": seed,
            "sft_accuracy": summary["sft_accuracy"],
            "heldout_accuracy": summary["heldout_accuracy"],
            "sft_loss_final": statistics.mean(r["sft/loss"] for r in sft[-10:]),
            "sft_s": sft[-1]["time/elapsed_s"],
            "rl_steps": len(rl),
            "rl_step_s": med(rl, "time/step_s"),
            "train_s": med(rl, "train/seconds"),
            "push_bytes": med(pushes, "weights/push_bytes"),
            "push_s": med(rl, "time/weight_push_s"),
            "peak_trainer_mib": peak.get("Trainer", float("nan")),
            "peak_generator_mib": peak.get("Generator", float("nan")),
            "minutes": (time.monotonic() - t0) / 60,
        }


def table(rows: list[dict]) -> str:
    """Medians over seeds, one column per variant, as a Markdown table."""
    names = list(dict.fromkeys(r["variant"] for r in rows))
    keys = [
        ("held-out accuracy after SFT", "sft_accuracy", "{:.3f}"),
        ("held-out accuracy after RL", "heldout_accuracy", "{:.3f}"),
        ("final SFT loss", "sft_loss_final", "{:.2f}"),
        ("SFT time (s)", "sft_s", "{:.0f}"),
        ("RL s/step", "rl_step_s", "{:.3f}"),
        ("of which training (s)", "train_s", "{:.3f}"),
        ("weight push (bytes)", "push_bytes", "{:,.0f}"),
        ("weight push (ms)", "push_s", "ms"),
        ("peak trainer RSS (MiB)", "peak_trainer_mib", "{:.0f}"),
        ("peak generator RSS (MiB)", "peak_generator_mib", "{:.0f}"),
        ("wall minutes", "minutes", "{:.1f}"),
    ]
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, key, fmt in keys:
        cells = []
        for n in names:
            xs = [r[key] for r in rows if r["variant"] == n]
            v = statistics.median(xs)
            cell = f"{v * 1e3:.1f}" if fmt == "ms" else fmt.format(v)
            if key.endswith("accuracy") and len(xs) > 1:
                cell += " (" + ", ".join(f"{x:.3f}" for x in xs) + ")"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument(
        "--variants",
        nargs="+",
        default=["full", "lora-rl"],
        choices=["full", "lora-rl", "lora", "lora-same-lr"],
    )
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lora-lr-scale", type=float, default=10.0)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    a = p.parse_args()
    rows = []
    for seed in a.seeds:
        for name in a.variants:
            print(f"[lora_vs_full] {name} preset={a.preset} seed={seed} ...", flush=True)
            rows.append(run_variant(name, a.preset, seed, a.overrides, a))
            print(json.dumps(rows[-1]), flush=True)
    print(
        f"\n{CONFIG} preset={a.preset} {' '.join(a.overrides)} (medians over seeds "
        f"{a.seeds}; LoRA rank {a.rank}, lr x{a.lora_lr_scale:g})\n"
    )
    print(table(rows))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
