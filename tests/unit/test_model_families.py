"""Every model family forge verifies, through every path that touches a model.

For each family a random-weight tiny model built from transformers' own config class
(``forge.models.tiny.FAMILY_PRESETS``: Llama, Qwen2, Qwen3, Gemma 3, Mistral, Phi-3; the
Gemma 3 and Mistral presets have an 8-token sliding window, so it bites): the generator's
logprobs equal the trainer's and the model's own unpadded forward, on a batch with left
padding, a group prefilled once, rows finishing at different steps and a prefix-cache hit; a
GRPO step changes the weights the way its advantages say, in full and with LoRA adapters.
"""

from __future__ import annotations

import pytest
import torch

from forge.generation import HFEngine
from forge.models import load_model, load_tokenizer, make_tiny_model
from forge.models.tiny import FAMILY_PRESETS
from forge.training import LoraConfig, OptimizerConfig, TrainerConfig, TrainerCore
from forge.types import SamplingParams
from tests.episodes import make_batch

TOLERANCE = 1e-4  # float32: the three computations agree to ~1e-6


@pytest.fixture(scope="module", params=FAMILY_PRESETS)
def family(request, tmp_path_factory) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp(request.param), preset=request.param))


def _own_forward(model, prompt_ids: list[int], token_ids: list[int], temperature: float):
    """Logprobs of ``token_ids`` from one unpadded forward over the whole row."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.no_grad():
        logits_tv = model(ids).logits[0].float() / temperature
    lp_tv = torch.log_softmax(logits_tv, -1)
    n = len(prompt_ids)
    return lp_tv[n - 1 : -1].gather(-1, torch.tensor(token_ids)[:, None])[:, 0]


def test_generator_trainer_and_own_forward_agree(family):
    model, tok = load_model(family), load_tokenizer(family)
    engine = HFEngine(model, tok, max_batch_size=4, prefix_cache_tokens=4096)
    requests = [
        ("Hi", SamplingParams(n=3, max_tokens=24, temperature=1.0, seed=1)),
        (
            "A considerably longer prompt, to force left padding onto the others",
            SamplingParams(n=2, max_tokens=30, temperature=0.7, seed=2),
        ),
        ("Greedy", SamplingParams(n=1, max_tokens=12, temperature=0)),
    ]
    first = engine.generate(requests)
    # The next turn of a finished conversation: its prompt starts with kept KV.
    done = first[0][0]
    turn = done.prompt_ids + done.token_ids + tok("more")["input_ids"]
    [second] = engine.generate([(turn, SamplingParams(n=2, max_tokens=10, seed=5))])
    assert engine.counters["prefix_hits"] >= 1 and engine.counters["prefill_shared_rows"] >= 1
    temperatures = [p.temperature or 1.0 for _, p in requests for _ in range(p.n)] + [1.0] * 2
    completions = [c for group in first for c in group] + second
    assert len({len(c.token_ids) for c in completions}) >= 3  # rows finish at different steps

    trainer = TrainerCore(TrainerConfig(model=family))
    for temperature in set(temperatures):
        rows = [c for c, t in zip(completions, temperatures) if t == temperature]
        trainer.cfg.temperature = temperature
        batch = _batch([(c.prompt_ids, c.token_ids) for c in rows], tok.pad_token_id)
        with torch.no_grad():
            trained_bt = trainer.logprobs(batch["ids"], batch["mask"])
        for i, c in enumerate(rows):
            generated = torch.tensor(c.logprobs)
            own = _own_forward(model, c.prompt_ids, c.token_ids, temperature)
            trained = trained_bt[i][batch["response"][i]]
            assert (generated - own).abs().max() < TOLERANCE, family
            assert (trained - own).abs().max() < TOLERANCE, family


def _batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    from forge.models import pad_and_stack

    ids, mask, response = pad_and_stack([p for p, _ in rows], [t for _, t in rows], pad_id)
    return {"ids": ids, "mask": mask, "response": response.bool()}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_grpo_step_moves_logprobs_as_the_advantages_say(family, lora):
    cfg = TrainerConfig(
        model=family,
        optimizer=OptimizerConfig(lr=1e-3),
        lora=LoraConfig(rank=4) if lora else None,
    )
    core = TrainerCore(cfg)
    batch = make_batch(family)
    mask = batch.response_mask_bt
    before = {n: p.detach().clone() for n, p in core.model.named_parameters() if p.requires_grad}

    advantages_b = torch.tensor([1.0, -1.0, 0.5, -0.5])  # tests/episodes.py

    def objective() -> float:
        """What the step ascends: the advantage-weighted mean token logprob of each row."""
        with torch.no_grad():
            lp_bt = core.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
        mean_b = (lp_bt * mask).sum(-1) / mask.sum(-1)
        return float((advantages_b * mean_b).sum())

    start = objective()
    core.train_step(batch)
    moved = [n for n, p in core.model.named_parameters() if n in before and not p.equal(before[n])]
    assert moved, f"{family}: no trainable weight changed"
    assert objective() > start


def test_chat_messages_for_a_model_without_a_chat_template_name_the_fix(tmp_path):
    from forge.generation.prompts import encode_prompt

    tok = load_tokenizer(make_tiny_model(tmp_path / "m"))
    tok.chat_template = None  # a base model's tokenizer
    with pytest.raises(ValueError, match="without a chat template.*plain-text prompts"):
        encode_prompt(tok, [{"role": "user", "content": "What is 3 plus 5?"}])
    assert encode_prompt(tok, "Question: What is 3 plus 5?\nAnswer:")[1]


@pytest.mark.parametrize("width", ["within_window", "wider"])
def test_shared_prefixes_give_the_full_forwards_logprobs(family, width):
    """The trainer's shared-prefix path (a group's prompt once) equals ``token_logprobs``; on a
    batch wider than a sliding window it steps aside (``None``) rather than differ."""
    from forge.models import token_logprobs
    from forge.models.shared_prefix import _full_span, shared_prefix_logprobs

    model = load_model(family)
    long = width == "wider"
    prompts = [[5, 6, 7], [5, 6, 7], [9, 10, 11, 12], [9, 10, 11, 12]]
    tails = [[20, 21], [22, 23, 24], [25], [26, 27]]
    if long:
        prompts = [p * 4 for p in prompts]
    batch = _batch(list(zip(prompts, tails)), pad_id=0)
    with torch.no_grad():
        shared = shared_prefix_logprobs(
            model, batch["ids"], batch["mask"], batch["response"].float(), min_saving=0.0
        )
        full = token_logprobs(model, batch["ids"], batch["mask"])
    if long and _full_span(model) < batch["ids"].shape[1]:
        assert shared is None
        return
    assert shared is not None
    resp = batch["response"]
    assert (shared[resp] - full[resp]).abs().max() < TOLERANCE
