"""LoRA in the trainer core (PEFT): only adapters train, every RL loss, the base-model
reference, pushes of adapter tensors, checkpoints of adapters, export with the adapter merged."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from forge.data.sft import sft_batch  # noqa: E402
from forge.losses import LossConfig  # noqa: E402
from forge.models import load_tokenizer  # noqa: E402
from forge.training import OptimizerConfig, TrainerConfig, TrainerCore  # noqa: E402
from forge.training.trainer_config import LoraConfig  # noqa: E402
from forge.weights import unpack_adapter  # noqa: E402
from tests.episodes import make_batch  # noqa: E402

ITEMS = [
    {"prompt": "Sum the digits of 4821.", "answer": "15"},
    {"prompt": "What is 2+3?", "answer": "5"},
    {"prompt": "Say hi.", "answer": "hi"},
]


def _lora_core(model: str, loss: str = "reinforce", **kw) -> TrainerCore:
    kw.setdefault("optimizer", OptimizerConfig(lr=1e-2))
    return TrainerCore(
        TrainerConfig(model=model, loss=LossConfig(type=loss), lora=LoraConfig(rank=4), **kw)
    )


def _base_weights(core: TrainerCore) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in core.model.named_parameters() if "lora_" not in n}


def test_sft_with_lora_trains_only_the_adapter_and_lowers_the_loss(tiny_model):
    core = _lora_core(tiny_model)
    adapter = [p for n, p in core.model.named_parameters() if "lora_" in n]
    in_optimizer = [p for g in core.optimizer.param_groups for p in g["params"]]
    assert adapter and len(in_optimizer) == len(adapter)
    assert {id(p) for p in in_optimizer} == {id(p) for p in adapter}
    assert sum(p.numel() for p in adapter) < 0.2 * sum(p.numel() for p in core.model.parameters())

    tok = load_tokenizer(tiny_model)
    items = [{"prompt": it["prompt"], "target": " " + it["answer"]} for it in ITEMS]
    batch = sft_batch(tok, items)
    base = _base_weights(core)
    lora_before = {n: p.detach().clone() for n, p in core.model.named_parameters() if "lora_" in n}
    losses = [core.train_step(batch)["loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.1, losses
    for name, t in _base_weights(core).items():
        assert torch.equal(t, base[name]), f"base weight {name} changed"
    changed = [
        n
        for n, p in core.model.named_parameters()
        if "lora_B" in n and not torch.equal(p, lora_before[n])
    ]
    assert changed, "no adapter tensor moved"


@pytest.mark.parametrize("loss", ["grpo", "ppo", "gspo", "reinforce"])
def test_every_rl_loss_trains_the_adapter(tiny_model, loss):
    # GSPO's band needs the trainer's own old logprobs (with the generator's it is refused).
    old = {"old_logprobs": "current"} if loss == "gspo" else {}
    core = _lora_core(tiny_model, loss=loss, optimizer=OptimizerConfig(lr=1e-3), **old)
    batch = make_batch(tiny_model)
    if loss == "ppo":  # per-token advantages, as a critic gives them
        batch.advantages_b = batch.advantages_b[:, None] * batch.response_mask_bt.float()
    base = _base_weights(core)
    metrics = core.train_step(batch)
    assert metrics["grad_norm"] > 0
    assert all(torch.equal(t, base[n]) for n, t in _base_weights(core).items())


def test_unknown_target_module_names_the_linear_layers(tiny_model):
    cfg = TrainerConfig(model=tiny_model, lora=LoraConfig(target_modules=["q_proj", "qkv"]))
    with pytest.raises(ValueError, match=r"\['qkv'\].*linear layers are .*'q_proj'"):
        TrainerCore(cfg)


def test_lora_config_errors_at_load():
    with pytest.raises(ValueError, match="needs trainer.backend hf"):
        TrainerConfig(model="m", backend="titan", lora=LoraConfig())
    with pytest.raises(ValueError, match="rank must be > 0"):
        LoraConfig(rank=0)
    assert TrainerConfig(model="m", lora={"rank": 4}).lora == LoraConfig(rank=4)


def test_reference_is_the_base_with_the_adapter_disabled(tiny_model):
    core = _lora_core(tiny_model, loss="grpo", optimizer=OptimizerConfig(lr=1e-2))
    batch = make_batch(tiny_model)
    for _ in range(2):
        core.train_step(batch)  # the adapter now moves the policy away from the base
    rows = torch.arange(batch.input_ids_bt.shape[0])
    ref_bt = core.base_logprobs(batch, rows)
    plain = TrainerCore(TrainerConfig(model=tiny_model))
    with torch.no_grad():
        base_bt = plain._rows_logprobs(batch, rows)
        policy_bt = core._rows_logprobs(batch, rows)
    mask = batch.response_mask_bt.bool()
    torch.testing.assert_close(ref_bt[mask], base_bt[mask], rtol=0, atol=1e-5)
    assert (policy_bt[mask] - base_bt[mask]).abs().max() > 1e-3


def test_kl_term_uses_the_disabled_adapter_reference(tiny_model):
    lora = LoraConfig(rank=4, disabled_reference=True)
    cfg = TrainerConfig(model=tiny_model, lora=lora, loss=LossConfig(type="grpo", kl_coef=0.1))
    core = TrainerCore(cfg)
    m0 = core.train_step(make_batch(tiny_model))
    assert m0["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # adapter starts at zero: policy = base
    core.train_step(make_batch(tiny_model))
    assert core.train_step(make_batch(tiny_model))["kl_ref"] > 0
    without = TrainerCore(
        TrainerConfig(
            model=tiny_model, lora=LoraConfig(rank=4), loss=LossConfig(type="grpo", kl_coef=0.1)
        )
    )
    with pytest.raises(ValueError, match="needs ref_logprobs_bt"):
        without.train_step(make_batch(tiny_model))


def test_push_carries_only_the_adapter(tiny_model):
    core = _lora_core(tiny_model)
    core.train_step(make_batch(tiny_model))
    spec, tensors = unpack_adapter(core.push_state_dict())
    assert (spec.rank, spec.alpha, spec.base_model) == (4, 16.0, tiny_model)
    adapter = {n: p for n, p in core.model.named_parameters() if "lora_" in n}
    assert len(tensors) == len(adapter)
    assert all(".lora_A.weight" in k or ".lora_B.weight" in k for k in tensors)
    full = core.hf_state_dict()
    assert sum(t.nbytes for t in tensors.values()) < 0.2 * sum(t.nbytes for t in full.values())


def test_checkpoint_holds_the_adapter_and_resume_is_exact(tiny_model, tmp_path):
    from forge.training import load_checkpoint, save_checkpoint

    core = _lora_core(tiny_model, loss="grpo", optimizer=OptimizerConfig(lr=1e-3))
    b1, b2, b3 = (make_batch(tiny_model, n=3, offset=k) for k in range(3))
    core.train_step(b1)
    save_checkpoint(tmp_path / "ckpt", core)
    assert not (tmp_path / "ckpt" / "model.safetensors").exists()
    size = (tmp_path / "ckpt" / "adapter.safetensors").stat().st_size
    assert size < 0.2 * sum(t.nbytes for t in core.hf_state_dict().values())
    first = [core.train_step(b)["loss"] for b in (b2, b3)]
    after = {k: v.clone() for k, v in core.push_state_dict().items()}

    again = _lora_core(tiny_model, loss="grpo", optimizer=OptimizerConfig(lr=1e-3))
    load_checkpoint(tmp_path / "ckpt", again)
    assert again.step == 1
    assert [again.train_step(b)["loss"] for b in (b2, b3)] == first
    for k, v in again.push_state_dict().items():
        assert torch.equal(v, after[k]), k


async def test_export_writes_the_adapter_and_forge_export_merges_it(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from forge.actors.trainer import Trainer
    from forge.cli import main as forge_main

    cfg = TrainerConfig(
        model=tiny_model,
        optimizer=OptimizerConfig(lr=1e-2),
        loss=LossConfig(type="reinforce"),
        lora=LoraConfig(rank=4),
    )
    trainer = await Trainer.as_actor(cfg)
    batch = make_batch(tiny_model)
    for _ in range(2):
        await trainer.train_step.call_one(batch)
    run = tmp_path / "run"
    await trainer.export_hf.call_one(str(run / "model"))
    want = await trainer.logprobs.call_one(batch)
    await trainer.close.call_one()
    assert (run / "model" / "adapter_config.json").is_file()
    assert not (run / "model" / "config.json").exists()  # not a full model: adapter only

    assert forge_main(["export", str(run), "--merge", str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    from forge.models import token_logprobs

    with torch.no_grad():
        got = token_logprobs(merged, batch.input_ids_bt, batch.attention_mask_bt)
    mask = batch.attention_mask_bt.bool()
    mask[:, 0] = False
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-4)
    plain = TrainerCore(TrainerConfig(model=tiny_model))
    with torch.no_grad():
        base = plain.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    assert (base[mask] - want[mask]).abs().max() > 1e-3  # the adapter is really in there

    # An adapter over the exported adapter (SFT with LoRA, then RL with LoRA): the trainer
    # starts from the merged SFT policy, and the export chains back to the first base.
    second = TrainerCore(TrainerConfig(model=str(run / "model"), lora=LoraConfig(rank=2)))
    with torch.no_grad():
        start = second.logprobs(batch.input_ids_bt, batch.attention_mask_bt)
    torch.testing.assert_close(start[mask], want[mask], rtol=0, atol=1e-4)
    second.adapter.peft.save_pretrained(tmp_path / "rl_adapter")
    assert (
        forge_main(["export", str(tmp_path / "rl_adapter"), "--merge", str(tmp_path / "m2")]) == 0
    )
    chained = AutoModelForCausalLM.from_pretrained(tmp_path / "m2").eval()
    with torch.no_grad():
        got2 = token_logprobs(chained, batch.input_ids_bt, batch.attention_mask_bt)
    torch.testing.assert_close(got2[mask], want[mask], rtol=0, atol=1e-4)
    assert forge_main(["export", str(tmp_path / "nothing"), "--merge", str(tmp_path / "x")]) == 2


def _pipeline(*overrides: str):
    from apps.pipeline.main import Config
    from forge.config.loader import load_config

    return load_config("apps/sumdigits/cpu.yaml", list(overrides), schema=Config)


def test_run_config_resolves_the_reference_of_a_lora_policy():
    kl = ["rl.trainer.loss.kl_coef=0.01", "rl.reference.update.type=none"]
    cfg = _pipeline("rl.trainer.lora.rank=8", *kl).rl
    assert cfg.reference.mode == "adapter_disabled" and cfg.trainer.lora.disabled_reference
    assert cfg.reference_service is None  # no ReferenceModel service is spawned
    cfg = _pipeline("rl.trainer.lora.rank=8", "rl.reference.mode=separate", *kl).rl
    assert cfg.reference_service is cfg.reference and not cfg.trainer.lora.disabled_reference
    cfg = _pipeline(*kl).rl
    assert cfg.reference.mode == "separate" and cfg.reference_service is cfg.reference
    with pytest.raises(ValueError, match="adapter_disabled needs trainer.lora"):
        _pipeline("rl.reference.mode=adapter_disabled", *kl)
    with pytest.raises(ValueError, match="moves the reference"):
        _pipeline("rl.trainer.lora.rank=8", "rl.reference.update.type=ema")


def test_a_vllm_generator_is_set_up_for_the_adapters():
    gen = _pipeline("rl.trainer.lora.rank=12", "rl.generator.backend=vllm").rl.generator
    assert gen.engine_kwargs == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 2}
    gen = _pipeline(
        "rl.trainer.lora.rank=8",
        "rl.generator.backend=vllm",
        "rl.generator.engine_kwargs={max_loras: 4, max_num_seqs: 8}",
    ).rl.generator
    assert gen.engine_kwargs == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 4,
        "max_num_seqs": 8,
    }
    with pytest.raises(ValueError, match=r"\['lm_head'\] cannot be served by .* vllm"):
        _pipeline(
            "rl.trainer.lora.rank=8",
            "rl.generator.backend=vllm",
            "rl.trainer.lora.target_modules=[q_proj,lm_head]",
        )
    with pytest.raises(ValueError, match="enable_lora is false"):
        _pipeline(
            "rl.trainer.lora.rank=8",
            "rl.generator.backend=vllm",
            "rl.generator.engine_kwargs={enable_lora: false}",
        )
    with pytest.raises(ValueError, match="max_lora_rank=8 is below trainer.lora.rank=16"):
        _pipeline(
            "rl.trainer.lora.rank=16",
            "rl.generator.backend=vllm",
            "rl.generator.engine_kwargs={max_lora_rank: 8}",
        )
