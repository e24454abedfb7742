"""Calculator tool use, learned on a 2-core CPU: SFT on the call format, then multi-turn GRPO.

Run:
    forge run --config apps/calc/cpu.yaml

    make_tiny_model ─┬─▶ SFT on tool episodes ──▶ GRPO: episodes with the mul tool ──▶ success
                     │   (half the factors random)   (exact-match reward, <= 3 turns)
                     └─▶ SFT on direct answers (no tool) ──▶ greedy exact match: no_tool

The questions are products of two 3-digit numbers (``apps.calc.task``). The tiny model cannot
compute them, but it can call ``mul`` and repeat the result. Two choices keep episodes short
for a 512-position model: its byte-level tokenizer gets BPE merges learned on the task's
text (``build_base_model``; digits stay one token each), so the call is ~25 tokens and a
whole episode ~66; and the tool is not listed in the prompt (``env.advertise_tools:
false``): the Hermes listing would take ~490 of the 512 positions, so the model learns the
tool from SFT instead.

SFT data carry random factors in half the calls (the tool's result and the answer follow
those factors), so SFT teaches the format and the copying of the result, and only part of
the copying of the factors; GRPO (reward 1 for an exact answer, 0 otherwise) sharpens it.
Both SFT stages are deterministic (``deterministic: true``), so every run starts GRPO from the
same model (0.484 held out on this project's machine).
Rollouts sample at temperature 0.5 (the trainer's logprobs use the same): at 1.0 the SFT
model's samples almost never succeed, so GRPO would see no reward at all.

The no-tool baseline is the same base model given an SFT of the same length on the same
questions answered directly (``no_tool`` section), scored greedily on the same held-out
questions. The last line reads ``success_rate=<after GRPO> baseline=<after SFT, with the
tool> no_tool=<direct answers> minutes=<z>``; all three are greedy exact-match rates on the
held-out questions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from apps.calc.task import parse_answer, tokenizer_corpus
from forge import (
    DATA_SOURCE,
    PipelineConfig,
    RLConfig,
    Stage,
    base_model,
    retarget,
    run_stage,
    sft_then_rl,
)

__all__ = ["Config", "run"]


@dataclass
class Config(PipelineConfig):
    no_tool: Stage | None = None
    """SFT on direct answers: the no-tool baseline (``None``: not measured)."""


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    started = time.perf_counter()
    heldout = heldout_questions(cfg)
    cfg.base_model = str(base_model(cfg, "calc-bpe", corpus=tokenizer_corpus()))
    result = await sft_then_rl(cfg, run_dir, resume, "calc")
    no_tool = float("nan")
    if cfg.no_tool is not None:
        no_tool = await no_tool_accuracy(cfg, heldout, run_dir, resume)
    after_sft, after_grpo = result["first"], result["last"]
    print(
        f"[calc] greedy exact match on {len(heldout)} held-out products: with the tool "
        f"{after_sft:.3f} after SFT, {after_grpo:.3f} after GRPO; without it {no_tool:.3f}"
    )
    print(
        f"success_rate={after_grpo:.3f} baseline={after_sft:.3f} no_tool={no_tool:.3f} "
        f"minutes={(time.perf_counter() - started) / 60:.2f}",
        flush=True,
    )


def heldout_questions(cfg: Config) -> list[dict]:
    """The RL stage's held-out questions; a ``ValueError`` before anything runs if that
    stage is not a GRPO run (its data source is where the questions come from)."""
    if not isinstance(cfg.rl, RLConfig):
        raise ValueError(
            f"apps.calc needs a GRPO rl stage (app: apps.grpo.main), got {type(cfg.rl).__name__}"
        )
    return DATA_SOURCE.resolve(cfg.rl.data)().heldout()


async def no_tool_accuracy(cfg: Config, heldout: list[dict], run_dir: Path, resume: bool) -> float:
    """SFT the base model (the one the tool run started from) on direct answers, then score
    its greedy answers to the held-out questions, checked as ``Calculator`` checks them."""
    retarget(cfg.no_tool, cfg.base_model)
    model_dir = (await run_stage(cfg.no_tool, run_dir / "no_tool", resume))["model"]
    answers = greedy_answers(model_dir, [q["prompt"] for q in heldout], max_tokens=16)
    right = sum(parse_answer(a) == q["target"] for a, q in zip(answers, heldout))
    return right / len(heldout)


def greedy_answers(model_dir: Path, questions: list[str], max_tokens: int) -> list[str]:
    """Greedy replies of the model in ``model_dir`` to single-message chats, in-process."""
    from forge import HFEngine, SamplingParams, load_model, load_tokenizer

    model = load_model(model_dir).eval()
    engine = HFEngine(model, load_tokenizer(model_dir), max_batch_size=len(questions))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    out = engine.generate([([{"role": "user", "content": q}], params) for q in questions])
    return [c[0].text for c in out]
