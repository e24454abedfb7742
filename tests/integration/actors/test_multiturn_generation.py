"""A real Generator actor (hf backend, tiny model) driven by run_episode with token-id prompts:
the trajectory's logprobs are the teacher-forced logprobs of its final token ids."""

from __future__ import annotations

import torch

from forge.actors.generator import Generator
from forge.envs import StepResult, run_episode
from forge.generation.backend import GeneratorConfig
from forge.models import load_model, load_tokenizer, token_logprobs
from forge.types import SamplingParams


class EchoEnv:
    """Never done; answers each turn with a short user message (duck-typed, sync methods)."""

    def __init__(self) -> None:
        self.turn = 0

    def reset(self, task):
        return [{"role": "system", "content": "Talk."}, {"role": "user", "content": task}]

    def step(self, action: str) -> StepResult:
        self.turn += 1
        return StepResult(f"turn {self.turn}: go on", reward=0.5)


async def test_three_turns_logprobs_match_teacher_forcing(tiny_model_dir):
    gen = await Generator.options(procs=1).as_actor(
        GeneratorConfig(model=tiny_model_dir, sampling=SamplingParams(max_tokens=8))
    )
    tok = load_tokenizer(tiny_model_dir)
    seen = []

    async def generate(prompt_ids, **sampling):
        out = await gen.generate.call_one(prompt_ids, **sampling)
        seen.append((list(prompt_ids), out[0]))
        return out

    sampling = {"max_tokens": 12, "temperature": 1.0, "seed": 5}
    traj = await run_episode(
        EchoEnv(), "hello there", generate, tok, max_turns=3, sampling=sampling
    )
    assert (traj.finish_reason, traj.num_turns, traj.turn_versions) == ("max_turns", 3, [0, 0, 0])
    assert traj.reward == 1.5  # every turn, the last one too, is stepped (0.5 each)
    for (prompt_ids, c), (start, end) in zip(seen, traj.turn_spans):
        assert c.prompt_ids == prompt_ids == traj.token_ids[:start]  # token ids in, verbatim
        assert traj.token_ids[start:end] == c.token_ids  # token ids out, verbatim
    assert sum(traj.loss_mask) == sum(len(c.token_ids) for _, c in seen)

    model = load_model(tiny_model_dir)
    ids_bt = torch.tensor([traj.token_ids])
    with torch.no_grad():
        lp_bt = token_logprobs(model, ids_bt, torch.ones_like(ids_bt), temperature=1.0)
    mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
    recomputed = lp_bt[0][mask]
    reported = torch.tensor(traj.logprobs)[mask]
    assert (recomputed - reported).abs().max().item() < 1e-4
    assert torch.tensor(traj.logprobs)[~mask].eq(0).all()
