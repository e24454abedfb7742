"""SFT: supervised fine-tuning on (prompt, target) pairs with the Trainer actor.

Run:
    forge run --config apps/sft/configs/sumdigits.yaml
    python -m apps.sft.main --config <yaml> [a.b=c ...]

    data source ──(prompt, target)──▶ tokenize ──TrainBatch──▶ Trainer ──export_hf──▶ model dir

The loss is the token-mean negative log-likelihood of the target tokens (REINFORCE with an
advantage of 1 on every target token is exactly that), so SFT reuses the RL trainer, its
optimiser, schedule, micro-batching and data parallelism unchanged. The result is written as
an HF model directory that an RL run can start from.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from apps.grpo.state import MetricLog, actor_env
from forge.actors.trainer import Trainer
from forge.envs.conversation import conversation_tokens
from forge.models import load_tokenizer
from forge.plugins import Spec
from forge.replay import collate_episodes
from forge.slots import DATA_SOURCE
from forge.training.config import TrainerConfig
from forge.types import Episode


@dataclass
class Config:
    app: str
    model: str
    trainer: TrainerConfig
    data: Spec  # a data source (forge.slots.DATA_SOURCE): items with "prompt" and "target"
    steps: int = 200
    batch_size: int = 64
    output: str = ""  # HF directory for the result; default <run_dir>/model
    metrics: list[str] = field(default_factory=lambda: ["jsonl"])
    threads_per_actor: int = 0  # 0: the host thread budget (controller.threads); N: fixed

    def __post_init__(self) -> None:
        DATA_SOURCE.validate(self.data, key="data")


def sft_batch(tokenizer, items: list[dict]):
    """Items are ``{"prompt", "target"}`` (prompt tokens as the generator encodes them; the
    target then EOS as the response) or ``{"messages": [...]}`` (a multi-turn transcript laid
    out as ``forge.envs.run_episode`` lays it out; only assistant turns are learned)."""
    eos = tokenizer.eos_token_id
    episodes = []
    for i, it in enumerate(items):
        mask = None
        if "messages" in it:
            ids, full_mask, p = conversation_tokens(tokenizer, it["messages"])
            prompt_ids, response_ids, mask = ids[:p], ids[p:], full_mask[p:]
        else:
            prompt_ids = tokenizer(it["prompt"], add_special_tokens=True)["input_ids"]
            response_ids = tokenizer(str(it["target"]), add_special_tokens=False)["input_ids"]
            response_ids = response_ids + [eos]
        episodes.append(
            Episode(
                f"sft-{i}",
                prompt_ids,
                response_ids,
                [0.0] * len(response_ids),
                reward=0.0,
                policy_version=0,
                advantage=1.0,
                loss_mask=mask,
            )
        )
    return collate_episodes(episodes, pad_id=tokenizer.pad_token_id or 0)


async def train(cfg: Config, run_dir: Path) -> Path:
    """Fine-tune and export; returns the HF directory of the result."""
    if cfg.trainer.loss.type != "reinforce":
        raise ValueError("SFT needs trainer.loss.type=reinforce (NLL with advantage 1)")
    env = actor_env(cfg.threads_per_actor)
    source = DATA_SOURCE.resolve(cfg.data)()
    tokenizer = load_tokenizer(cfg.model)
    trainer = await Trainer.options(env=env).as_actor(cfg.trainer)
    log = MetricLog(run_dir, cfg.metrics)
    bar = tqdm(range(cfg.steps), desc="sft", file=sys.stdout, dynamic_ncols=True)
    for step in bar:
        batch = sft_batch(tokenizer, [source.sample() for _ in range(cfg.batch_size)])
        m = (await trainer.train_step.call(batch)).item(procs=0)
        log.step(step + 1, {"sft/loss": m["loss"], "sft/lr": m["lr"]})
        bar.set_postfix(loss=f"{m['loss']:.4f}")
    bar.close()
    out = Path(cfg.output or run_dir / "model")
    await trainer.export_hf.call(str(out))
    await trainer.shutdown()
    log.close()
    return out


async def run(cfg: Config, run_dir: Path, resume: bool) -> None:
    out = await train(cfg, run_dir)
    print(f"[sft] model written to {out}")


if __name__ == "__main__":
    from forge.cli import main as forge_main

    sys.exit(forge_main(["run", *sys.argv[1:]]))
