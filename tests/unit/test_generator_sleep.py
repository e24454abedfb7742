"""Issue 35: the hf generator's sleep/wake cycle (time-sliced colocation), in process on CPU.

Every transition: requests held while asleep, level 1 (KV cache) and level 2 (weights too),
a weight update while asleep, a failed one, waking without weights; and memory that comes back
to the same level cycle after cycle (live tensor bytes exactly, host RSS within a bound)."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import warnings

import psutil
import pytest
import torch

from forge.generation.backend import GeneratorConfig
from forge.generation.hf_backend import HFBackend
from forge.models import make_tiny_model
from forge.observability.memory import move_optimizer_state, tensor_bytes
from forge.types import SamplingParams

PROMPTS = ["12+7=", "3+4=", "40+2=", "9+9="]
PARAMS = SamplingParams(n=4, max_tokens=12, temperature=1.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    # "small" (~3M parameters, 12 MB): a leaked copy per cycle shows in RSS
    return str(make_tiny_model(tmp_path_factory.mktemp("small"), preset="small"))


async def _backend(model_dir: str) -> HFBackend:
    backend = HFBackend(GeneratorConfig(model=model_dir, max_batch_size=16))
    await backend.start()
    return backend


def _shifted(backend: HFBackend, by: float) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() + by for k, v in backend.named_weights().items()}


async def _generate(backend: HFBackend) -> list:
    return await asyncio.gather(*(backend.generate(p, PARAMS) for p in PROMPTS))


async def test_level_1_frees_the_kv_cache_and_holds_requests_until_wake(model_dir):
    backend = await _backend(model_dir)
    try:
        await _generate(backend)
        assert backend.stats()["kv_cache_bytes"] > 0  # finished rows' KV, kept for next turns
        weights = backend.stats()["weight_bytes"]
        await backend.sleep(1)
        s = backend.stats()
        assert s["asleep"] and s["kv_cache_bytes"] == 0 and s["weight_bytes"] == weights
        held = asyncio.ensure_future(backend.generate("1+1=", PARAMS))
        await asyncio.sleep(0.2)
        assert not held.done() and backend.stats()["queued"] == 1  # waits, does not fail
        await backend.wake()
        assert len(await held) == 4
        await backend.wake()  # awake already: a no-op
        assert backend.stats()["wakes"] == 1
    finally:
        await backend.close()


async def test_level_2_frees_the_weights_and_an_update_while_asleep_brings_new_ones(model_dir):
    backend = await _backend(model_dir)
    try:
        new = _shifted(backend, 0.01)
        await backend.sleep(2)
        s = backend.stats()
        assert s["weight_bytes"] == 0 and s["kv_cache_bytes"] == 0
        meta = backend.named_weights()  # what an update must bring: shapes, on "meta"
        assert {k: tuple(v.shape) for k, v in meta.items()} == {
            k: tuple(v.shape) for k, v in new.items()
        }
        with pytest.raises(RuntimeError, match="no weight update has loaded new ones"):
            await backend.wake()
        await backend.update_weights(new, 1, "in_flight")
        held = asyncio.ensure_future(backend.generate("1+1=", PARAMS))
        await backend.wake()
        assert {c.generator_version for c in await held} == {1}
        now = backend.named_weights()
        for name, t in now.items():
            assert torch.equal(t, new[name]), name
        # The tied input/output embeddings are still one tensor (make_tiny_model ties them).
        assert now["lm_head.weight"].data_ptr() == now["model.embed_tokens.weight"].data_ptr()
    finally:
        await backend.close()


async def test_a_pull_into_the_model_while_asleep_fills_the_freed_weights(model_dir):
    backend = await _backend(model_dir)
    try:
        new = _shifted(backend, -0.02)
        await backend.sleep(2)

        def pull(into):
            for name, t in into.items():
                t.copy_(new[name])
            return into

        await backend.update_weights_from(pull, 1, "in_flight")
        await backend.wake()
        for name, t in backend.named_weights().items():
            assert torch.equal(t, new[name]), name
        assert len(await backend.generate("2+2=", PARAMS)) == 4
    finally:
        await backend.close()


async def test_a_failed_update_while_asleep_keeps_it_asleep_until_a_good_one(model_dir):
    backend = await _backend(model_dir)
    try:
        good = _shifted(backend, 0.01)
        await backend.sleep(2)
        bad = dict(good)
        bad.pop(next(k for k in bad if ".mlp." in k))  # a missing tensor: refused
        with pytest.raises(ValueError, match="pushed weights miss"):
            await backend.update_weights(bad, 1, "in_flight")
        with pytest.raises(RuntimeError, match="no weight update has loaded new ones"):
            await backend.wake()  # the model holds uninitialised memory: never serve it
        await backend.update_weights(good, 1, "in_flight")
        await backend.wake()
        assert {c.generator_version for c in (await _generate(backend))[0]} == {1}
    finally:
        await backend.close()


def _trimmed_rss(process) -> int:
    """The process's resident bytes after glibc hands its free heap pages back (where it can):
    what is left is memory in use, not the allocator's cache."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass
    return process.memory_info().rss


def _live_tensor_bytes() -> int:
    gc.collect()
    with warnings.catch_warnings():  # (isinstance on some torch objects warns of deprecation)
        warnings.simplefilter("ignore")
        return tensor_bytes(o for o in gc.get_objects() if isinstance(o, torch.Tensor))


async def _settled_tensor_bytes(samples: int = 5) -> int:
    """Live tensor bytes once settled: two samples 50 ms apart that agree, else the least of
    ``samples``. A thread-pool worker (``asyncio.to_thread``) can still hold its call's
    arguments, the pushed weights, for a moment after the caller resumes; a leak is there in
    every sample. (Each sample scans every object of the process: seconds in an xdist worker
    that has imported the whole unit tier.)"""
    out = [_live_tensor_bytes()]
    while len(out) < samples:
        await asyncio.sleep(0.05)
        out.append(_live_tensor_bytes())
        if out[-1] == out[-2]:
            break
    return min(out)


async def test_memory_after_sleep_wake_cycles_does_not_grow(model_dir):
    backend = await _backend(model_dir)
    process = psutil.Process()
    try:
        live, rss = [], []
        for cycle in range(1, 7):
            await _generate(backend)
            new = _shifted(backend, 0.001 * cycle)  # (the trainer's next version)
            await backend.sleep(2)
            s = backend.stats()
            assert (s["kv_cache_bytes"], s["weight_bytes"]) == (0, 0), (cycle, s)
            await backend.update_weights(new, cycle, "in_flight")
            del new
            await backend.wake()
            live.append(await _settled_tensor_bytes())
            rss.append(_trimmed_rss(process))
        weights = backend.stats()["weight_bytes"]
        assert weights > 10 * 2**20  # the model is big enough for a leak to show
        # Tensors: exactly what the first cycle left (a KV cache or weight copy kept per
        # cycle would add megabytes).
        assert max(live[1:]) - live[0] < 0.01 * weights, live
        # Host RSS after malloc_trim: allocator noise allowed (measured: within 3 MiB over 5
        # cycles; without the trim CI saw +35), not a model copy kept per cycle (+57 MiB).
        assert rss[-1] - rss[0] < 3 * weights, [r // 2**20 for r in rss]
    finally:
        await backend.close()


def test_optimizer_offload_moves_nothing_on_cpu_and_keeps_the_state():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in opt.state[model.weight].items()}
    moved, where = move_optimizer_state(opt, "cpu")
    assert (moved, where) == (0, {})
    assert move_optimizer_state(opt, None, where) == (0, {})
    for k, v in opt.state[model.weight].items():
        assert torch.equal(v, before[k])


async def test_vllm_sleep_without_a_gpu_is_an_error_not_a_no_op():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from forge.generation.vllm_backend import VLLMBackend

    cfg = GeneratorConfig(model="/m", backend="vllm", engine_kwargs={"enable_sleep_mode": True})
    with pytest.raises(RuntimeError, match="vLLM sleep mode .* needs a GPU"):
        await VLLMBackend(cfg).sleep(2)
