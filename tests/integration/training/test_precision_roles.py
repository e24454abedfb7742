"""``auto`` precision is decided in each role's own process, for its own host.

``FORGE_CPU_BF16`` forces the CPU probe of the process that reads it, so a role started with
one value while this (the controller's) process has the other shows whose CPU decided: on a
cluster the two are different machines.
"""

from __future__ import annotations

from forge.actors.generator import Generator
from forge.actors.trainer import Trainer
from forge.generation.backend import GeneratorConfig
from forge.models import precision
from forge.run.actors import actor_env_vars
from forge.training import TrainerConfig

NAME = "model.embed_tokens.weight"


async def test_roles_decide_auto_on_their_own_cpu_and_pulls_cast(tiny_model, monkeypatch):
    """The controller's CPU says float32; the trainer's and one generator's say bf16: the
    trainer trains under bf16 autocast and pushes bf16, that generator computes in bf16. A
    generator whose CPU says float32 loads the bf16 push cast to float32 (the rounded
    values)."""
    monkeypatch.setenv("FORGE_CPU_BF16", "0")
    assert precision.auto_dtype("cpu") == "float32"  # what the controller would have chosen
    bf16 = {**actor_env_vars(1), "FORGE_CPU_BF16": "1"}
    fp32 = {**actor_env_vars(1), "FORGE_CPU_BF16": "0"}
    weights = {"prefix": "prec-roles", "dtype": "auto"}
    cfg = TrainerConfig(model=tiny_model, device="cpu", autocast="auto", weights=weights)
    trainer = await Trainer.options(env_vars=bf16).as_actor(cfg)
    handle = await trainer.push_weights.call_one(1)
    assert {m.dtype for m in handle.manifest.values()} == {"bfloat16"}
    pushed = (await trainer.state_dict.call_one())[NAME]
    gen_cfg = GeneratorConfig(model=tiny_model, dtype="auto", weights={"prefix": "prec-roles"})
    native = await Generator.options(env_vars=bf16).as_actor(gen_cfg)
    plain = await Generator.options(env_vars=fp32).as_actor(gen_cfg)
    for gen, dtype in ((native, "bfloat16"), (plain, "float32")):
        assert str((await gen.get_param.call_one(NAME)).dtype) == f"torch.{dtype}"
        assert await gen.update_weights.call_one(handle=handle) == 1
        got = await gen.get_param.call_one(NAME)
        assert str(got.dtype) == f"torch.{dtype}"
        assert (got.float() == pushed.bfloat16().float()).all()  # the bf16-rounded values
    await trainer.close.call_one()
