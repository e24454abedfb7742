"""Issue 35: placement that can share a GPU, checked when the config loads (no processes).

``check_placement`` takes the visible GPU count as an argument, so every rule is tested here
on a machine without GPUs; ``RLConfig`` passes ``torch.cuda.device_count()``."""

from __future__ import annotations

import pytest

from forge.config import config_from_dict
from forge.observability.memory import apply_memory_fraction, tensor_bytes
from forge.run.colocate import memory_metrics
from forge.run.placement import PlacementConfig, check_placement, disjoint_gpus
from forge.run.rl_config import RLConfig


def _check(p: PlacementConfig, **over) -> None:
    args = dict(
        generator_gpu=True,
        trainer_gpu=True,
        generators=1,
        trainer_procs=1,
        max_policy_age=0,
        stream=False,
        visible=1,
    )
    check_placement(p, **{**args, **over})


def test_disjoint_default_gives_each_gpu_process_its_own_gpu_when_there_are_enough():
    one = dict(generator_gpu=True, trainer_gpu=True, generators=1, trainer_procs=1)
    assert disjoint_gpus(**one, visible=2)
    # Too few: no error (the roles share the GPUs uncapped, as the apps ran on one H100).
    _check(PlacementConfig(), visible=1)
    assert not disjoint_gpus(**one, visible=1)
    assert not disjoint_gpus(**{**one, "generators": 2, "trainer_procs": 3}, visible=4)
    assert disjoint_gpus(**{**one, "generator_gpu": False, "trainer_procs": 3}, visible=3)
    assert not disjoint_gpus(**one, visible=0)


def test_no_visible_gpu_skips_counts_so_gpu_configs_still_validate():
    _check(PlacementConfig(colocate=True), trainer_procs=2, visible=0)


def test_one_gpu_fits_when_shared():
    _check(PlacementConfig(colocate=True))
    _check(PlacementConfig(generator_memory=0.3, trainer_memory=0.6))
    with pytest.raises(ValueError, match=r"colocate needs 2 GPU\(s\).*1 are visible"):
        _check(PlacementConfig(colocate=True), trainer_procs=2, visible=1)


def test_memory_shares_that_do_not_fit_are_refused_with_their_sum():
    with pytest.raises(ValueError, match=r"generator_memory 0.6 \+ trainer_memory 0.5 = 1.10"):
        PlacementConfig(generator_memory=0.6, trainer_memory=0.5)
    for bad in (-0.1, 1.0, True, "0.5"):
        with pytest.raises(ValueError, match=r"placement.generator_memory .* \[0, 1\)"):
            PlacementConfig(generator_memory=bad)


def test_shares_need_both_roles_on_a_gpu_and_one_generator():
    with pytest.raises(ValueError, match="the generator runs on the CPU"):
        _check(PlacementConfig(generator_memory=0.3), generator_gpu=False)
    with pytest.raises(ValueError, match="replicas.generator=2"):
        _check(PlacementConfig(colocate=True), generators=2, visible=2)


def test_colocation_is_on_policy_only():
    with pytest.raises(ValueError, match=r"max_policy_age=1 .* max_policy_age: 0"):
        _check(PlacementConfig(colocate=True), max_policy_age=1)
    with pytest.raises(ValueError, match="stream: false"):
        _check(PlacementConfig(colocate=True), stream=True)
    _check(PlacementConfig(generator_memory=0.3, trainer_memory=0.6), max_policy_age=1)


def test_colocation_knobs_without_colocation_are_errors():
    with pytest.raises(ValueError, match="placement.sleep_level applies to time-sliced"):
        PlacementConfig(sleep_level=1)
    with pytest.raises(ValueError, match="placement.offload_optimizer applies"):
        PlacementConfig(offload_optimizer=False)
    with pytest.raises(ValueError, match="sleep_level must be 1"):
        PlacementConfig(colocate=True, sleep_level=3)


def _rl(**over) -> dict:
    base = {
        "app": "x",
        "policy": {"model": "/m"},
        "data": "jsonl",
        "rewards": ["exact_match"],
        "max_policy_age": 0,
    }
    return {**base, **over}


def test_run_config_refuses_colocation_ahead_of_policy_and_lora_at_level_2():
    cfg = config_from_dict(RLConfig, _rl(placement={"colocate": True}))
    assert cfg.placement.mode == "colocate"  # on CPU: the phases run, nothing to count
    with pytest.raises(ValueError, match="max_policy_age=1"):
        config_from_dict(RLConfig, _rl(placement={"colocate": True}, max_policy_age=1))
    lora = {"trainer": {"lora": {"rank": 4}}}
    with pytest.raises(ValueError, match="sleep_level: 1"):
        config_from_dict(RLConfig, _rl(placement={"colocate": True}, **lora))
    config_from_dict(RLConfig, _rl(placement={"colocate": True, "sleep_level": 1}, **lora))


def test_run_config_shares_flow_to_the_roles_once():
    gpu = {"generator": {"device": "cuda"}, "trainer": {"device": "cuda"}}
    cfg = config_from_dict(
        RLConfig, _rl(placement={"generator_memory": 0.3, "trainer_memory": 0.6}, **gpu)
    )
    assert (cfg.generator.memory_fraction, cfg.trainer.memory_fraction) == (0.3, 0.6)
    # The same fact stated twice, differently: an error naming both keys.
    twice = {"generator": {"device": "cuda", "memory_fraction": 0.5}, "trainer": gpu["trainer"]}
    with pytest.raises(ValueError, match=r"generator.memory_fraction=0.5 and placement"):
        config_from_dict(RLConfig, _rl(placement={"generator_memory": 0.3}, **twice))
    # On the CPU a share caps nothing: an error, not a silent no-op.
    with pytest.raises(ValueError, match="runs on the CPU"):
        config_from_dict(RLConfig, _rl(placement={"generator_memory": 0.3}))


def test_vllm_colocation_turns_on_sleep_mode_and_a_share_is_its_utilization():
    vllm = {"backend": "vllm", "engine_kwargs": {"gpu_memory_utilization": 0.5}}
    with pytest.raises(ValueError, match="state the same fact"):
        config_from_dict(
            RLConfig,
            _rl(placement={"generator_memory": 0.3}, generator=vllm, trainer={"device": "cuda"}),
        )
    cfg = config_from_dict(
        RLConfig, _rl(placement={"colocate": True}, generator={"backend": "vllm"})
    )
    assert cfg.generator.engine_kwargs["enable_sleep_mode"] is True


def test_a_memory_fraction_without_a_gpu_is_an_error_not_a_no_op():
    apply_memory_fraction(0.0, "trainer")  # no cap asked: nothing to do
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match=r"trainer.memory_fraction=0.4 .* no GPU is visible"):
        apply_memory_fraction(0.4, "trainer")


def test_memory_metrics_name_role_phase_and_take_the_largest_process():
    snaps = [{"rss_mb": 10.0, "gpu_peak_mb": 3.0}, {"rss_mb": 12.0, "gpu_peak_mb": 1.0}]
    assert memory_metrics("trainer", "train", snaps) == {
        "memory/trainer/train/rss_mb": 12.0,
        "memory/trainer/train/gpu_peak_mb": 3.0,
    }


def test_tensor_bytes_counts_shared_storage_once():
    import torch

    a = torch.zeros(10, dtype=torch.float32)
    assert tensor_bytes([a, a[2:], None, torch.zeros(3, dtype=torch.float64)]) == 40 + 24


def test_forge_top_shows_each_roles_memory_per_phase():
    from forge.cli.top import render
    from forge.observability.status import StepStatus
    from tests.unit.test_status_top import _text, status_snapshot

    st = StepStatus("grpo", steps_total=4)
    st.step(
        1,
        {
            "memory/generator/generate/rss_mb": 900.0,
            "memory/generator/asleep/rss_mb": 300.0,
            "memory/trainer/train/rss_mb": 700.0,
            "memory/trainer/train/gpu_allocated_mb": 50.0,
            "memory/x/y": 1.0,
        },
    )
    # The GPU figure where a process has one, else host RSS.
    assert st.fields["memory"] == {
        "generator": {"generate": 900.0, "asleep": 300.0},
        "trainer": {"train": 50.0},
    }
    snap = status_snapshot()
    snap["extra"]["rl"]["memory"] = st.fields["memory"]
    text = _text(render(snap, "runs/demo/status.json"))
    assert "generator generate 900M asleep 300M  trainer train 50M" in text, text


def test_disjoint_gpu_roles_ask_the_provisioner_for_gpus_of_their_own(monkeypatch):
    import forge.run.rl_config as run_config

    gpu = {"generator": {"device": "cuda"}, "trainer": {"device": "cuda"}}
    cfg = config_from_dict(RLConfig, _rl(**gpu))
    for visible, want in ((2, {"with_gpus": True}), (1, {}), (0, {})):
        monkeypatch.setattr(run_config, "gpu_count", lambda v=visible: v)  # GPUs "visible"
        assert cfg.gpu_options("generator") == want, visible
        assert cfg.gpu_options("trainer") == want, visible
    monkeypatch.setattr(run_config, "gpu_count", lambda: 2)
    shared = config_from_dict(RLConfig, _rl(placement={"colocate": True}, **gpu))
    assert shared.gpu_options("trainer") == {}  # shared: every GPU visible to both
    cpu_gen = config_from_dict(RLConfig, _rl(trainer={"device": "cuda"}))
    assert cpu_gen.gpu_options("generator") == {}
    assert cpu_gen.gpu_options("trainer") == {"with_gpus": True}


def test_bf16_pushes_need_every_puller_to_compute_in_bf16():
    push = {"trainer": {"weights": {"dtype": "bfloat16"}}}
    with pytest.raises(ValueError, match=r"generator.dtype='float32' would compute with the "):
        config_from_dict(RLConfig, _rl(**push))
    ok = config_from_dict(RLConfig, _rl(**push, generator={"dtype": "bfloat16"}))
    assert ok.trainer.weights.dtype == "bfloat16"
    ref = {"reference": {"dtype": "float32", "update": {"type": "reset", "every": 2}}}
    with pytest.raises(ValueError, match=r"reference.dtype='float32'"):
        config_from_dict(RLConfig, _rl(**push, generator={"dtype": "bfloat16"}, **ref))
