"""The ``"hf"`` generator backend: ``HFEngine`` driven by an asyncio task, continuous batching.

``generate`` calls put requests in an inbox and await a future. One background task (the
*serve loop*) admits inbox requests between decode steps, runs each step in a worker thread
(``asyncio.to_thread``, so the actor's event loop keeps answering calls) and resolves a
request's future when all its samples are done. Admission keeps the total number of sampled
sequences in flight at most ``max_batch_size``; a larger request is admitted alone.

Weight updates and versions. Every request is generated entirely with one version's weights
and reports it as ``generator_version``; no completion ever mixes two versions.

- ``mode="in_flight"`` (default), no global drain: if nothing is running, the new weights are
  copied into the model in place between two steps. Otherwise the backend opens a new *lane*:
  a second model object built around the pulled tensors (``copy.deepcopy`` with the
  parameters pre-mapped, so the old weights are not copied), with its own ``HFEngine``.
  Requests admitted from then on go to the new lane; running ones finish in the old lane on
  the old weights, and the old lane (and its model) is freed when it empties. Both lanes
  step while they overlap. The cost: the weights are held twice for as long as the longest
  old request runs. The alternative of swapping in place would change the weights under a
  running sequence (its KV cache and later tokens would mix versions).
- ``mode="drain"``: stop admitting, wait until nothing runs, copy in place, resume.

Pushed tensors must match the model's names and shapes exactly; a dtype difference is cast
to the model's dtype (a float32 trainer feeding a bfloat16 generator). A version that holds a
LoRA adapter (``forge.weights.adapter``, pushed by a trainer with ``lora``) is applied to the
base this replica holds (``forge.training.lora.LoraApplier``, ``GeneratorConfig.lora_mode``):
it becomes the whole state dict with only the adapted tensors new, so the same in-place and
in-flight paths load it, copying only what changed.

Prefix reuse (``GeneratorConfig.prefix_cache_tokens``): each lane's engine keeps finished
sequences' KV for the next turn of their conversation (see ``hf_engine``). The cache lives in
the lane, so it is per weight version: a new lane starts empty, and an in-place swap empties
the current lane's cache before touching the weights. A conversation's turns reach the same
replica (and so its cache) when called inside ``async with generator.session():``.
``stats()`` counts ``prefix_hits``/``prefix_misses``/``prefix_reused_tokens``/``prefill_tokens``
over the replica's life and reports ``prefix_cached_tokens`` kept now.

Sleep (``placement.colocate``, ``forge.generation.sleep``): ``sleep(level)`` holds new
requests, lets running ones finish, drops the kept KV and (level 2) the weights; a weight
update while asleep gives the model storage again and fills it; ``wake()`` serves the held
requests. ``stats()`` reports ``kv_cache_bytes`` and ``weight_bytes`` held now.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import torch

from controller import threads
from forge.generation.backend import GeneratorBackend, GeneratorConfig
from forge.generation.hf_engine import HFEngine
from forge.generation.hf_weights import HFWeights, Lane
from forge.generation.prompts import Prompt
from forge.observability.memory import apply_memory_fraction, tensor_bytes
from forge.types import Completion, SamplingParams

logger = logging.getLogger("forge.generator")


@dataclass
class _Request:
    prompt: Prompt
    params: SamplingParams
    future: asyncio.Future
    adapter: str | None = None


class HFBackend(HFWeights, GeneratorBackend):
    """Continuous-batching generation on a transformers model. See the module docstring;
    weight updates, adapters and sleep are ``HFWeights``'s (``hf_weights.py``)."""

    def __init__(self, config: GeneratorConfig) -> None:
        self.config = config
        self.tokenizer = None
        self.version = 0
        self._inbox: deque[_Request] = deque()
        self._lanes: list[Lane] = []  # the last one admits new requests
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._step_lock = asyncio.Lock()  # held while a step runs or weights change
        self._update_lock = asyncio.Lock()  # one weight update at a time
        self._paused = False
        self._asleep = False  # placement.colocate: requests wait in the inbox until wake()
        self._dropped = None  # a level-2 sleep's DroppedWeights until an update refills them
        self._needs_weights = False  # materialised storage not yet filled by an update
        self._task: asyncio.Task | None = None
        self._stats = dict.fromkeys(
            ("steps", "requests", "completions", "tokens", "max_batch_rows"), 0
        )
        self._stats.update(weight_updates=0, in_flight_updates=0, max_lanes=0, sleeps=0, wakes=0)
        self._prefix_counters: Counter = Counter()  # shared by every lane's engine
        self._lora = None  # a forge.training.lora.LoraApplier once an adapter is pushed
        self._slots = None  # lora_mode multi: forge.generation.multi_lora.LoraSlots
        self._adapters: dict[str, tuple[int, int]] = {}  # multi: name -> (slot, version)

    # ---- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        apply_memory_fraction(self.config.memory_fraction, "generator")
        model, self.tokenizer = await asyncio.to_thread(self._load)
        self._lanes = [self._new_lane(model, version=0)]
        self._drained.set()
        self._task = asyncio.create_task(self._serve(), name="hf-generator-serve")

    def _load(self):
        from forge.models import load_tokenizer
        from forge.training.lora import load_base_model

        cfg = self.config
        # (An exported LoRA policy, an adapter directory, loads as its merged model.)
        model = load_base_model(cfg.model, cfg.dtype, cfg.device, cfg.attn_implementation)
        if cfg.lora_mode == "multi":
            from forge.generation.multi_lora import LoraSlots

            self._slots = LoraSlots(model)
        return model, load_tokenizer(cfg.model)

    def _new_lane(self, model, version: int) -> Lane:
        return Lane(self._new_engine(model, version))

    def _new_engine(self, model, version: int) -> HFEngine:
        cfg = self.config
        return HFEngine(
            model,
            self.tokenizer,
            cfg.max_batch_size,
            version,
            cfg.seed + version,
            prefix_cache_tokens=0 if self._slots is not None else cfg.prefix_cache_tokens,
            counters=self._prefix_counters,
            lora=self._slots,
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        error = RuntimeError("the generator is shutting down")
        for req in self._inbox:
            _fail(req.future, error)
        for lane in self._lanes:
            for fut, _ in lane.futures.values():
                _fail(fut, error)
            lane.release()
        self._inbox.clear()
        self._lanes = []

    # ---- requests -----------------------------------------------------------------------

    async def generate(
        self, prompt: Prompt, params: SamplingParams, adapter: str | None = None
    ) -> list[Completion]:
        if self._task is None or self._task.done():
            raise RuntimeError("the hf generator is not serving; was setup() run (or closed)?")
        if adapter is not None and adapter not in self._adapters:
            raise ValueError(
                f"adapter {adapter!r} is not loaded on this generator (loaded: "
                f"{sorted(self._adapters) or 'none'}; lora_mode multi loads them with load_adapter)"
            )
        future = asyncio.get_running_loop().create_future()
        self._inbox.append(_Request(prompt, params, future, adapter))
        self._stats["requests"] += 1
        self._wake.set()
        return await future

    async def _serve(self) -> None:
        # Busy in the host's thread budget (controller.threads) while there is work: decode
        # steps run with this process's share of the cores, re-read every step.
        busy = None
        try:
            while True:
                if not self._has_work():
                    if busy is not None:
                        busy.__exit__(None, None, None)
                        busy = None
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if busy is None:
                    busy = threads.compute()
                    busy.__enter__()
                async with self._step_lock:
                    self._admit()
                    lanes = [lane for lane in self._lanes if lane.engine.has_work()]
                    if lanes:
                        try:
                            results = await asyncio.to_thread(_step_lanes, lanes)
                        except Exception as e:  # noqa: BLE001 - fail its requests, keep serving
                            logger.exception("generation step failed")
                            self._reset_lanes(lanes, e)
                        else:
                            self._deliver(results)
                    self._retire_idle_lanes()
                # Yield so that waiting endpoint tasks (new requests, updates) get to run.
                await asyncio.sleep(0)
        finally:
            if busy is not None:
                busy.__exit__(None, None, None)

    def _has_work(self) -> bool:
        queued = bool(self._inbox) and not self._paused and not self._asleep
        return queued or any(lane.engine.has_work() for lane in self._lanes)

    def _admit(self) -> None:
        """Move inbox requests to the current lane while they fit in ``max_batch_size``."""
        lane = self._lanes[-1]
        busy = sum(lane.rows for lane in self._lanes)
        while self._inbox and not self._paused and not self._asleep:
            req = self._inbox[0]
            if busy > 0 and busy + req.params.n > self.config.max_batch_size:
                break
            self._inbox.popleft()
            if req.future.done():  # the caller gave up (cancelled, timed out)
                continue
            try:
                if req.adapter is None:
                    request_id = lane.engine.add_request(req.prompt, req.params)
                else:  # the adapter's newest version at admission
                    slot, version = self._adapters[req.adapter]
                    request_id = lane.engine.add_request(
                        req.prompt, req.params, slot, version, req.adapter
                    )
            except (TypeError, ValueError) as e:  # bad prompt: that caller's error only
                req.future.set_exception(e)
                continue
            lane.futures[request_id] = (req.future, req.params.n)
            lane.rows += req.params.n
            busy += req.params.n
        if busy:
            self._drained.clear()
        self._stats["max_batch_rows"] = max(self._stats["max_batch_rows"], busy)

    def _deliver(self, results: list[tuple[Lane, list[tuple[int, list[Completion]]]]]) -> None:
        self._stats["steps"] += 1
        for lane, finished in results:
            for request_id, completions in finished:
                future, n = lane.futures.pop(request_id)
                lane.rows -= n
                self._stats["completions"] += len(completions)
                self._stats["tokens"] += sum(len(c.token_ids) for c in completions)
                if not future.done():
                    future.set_result(completions)
        if not any(lane.rows for lane in self._lanes):
            self._drained.set()
        if self._slots is not None:
            self._free_slots()

    def _free_slots(self) -> None:
        """Recycle the slots of adapter versions no request uses any more."""
        current = {slot for slot, _ in self._adapters.values()}
        in_use = set().union(*(lane.engine.slots_in_use() for lane in self._lanes))
        for slot in list(self._slots.spec):
            if slot not in current and slot not in in_use:
                self._slots.free(slot)

    async def prompt_logprobs(
        self, token_ids: list[int], adapter: str | None = None
    ) -> list[float]:
        """Logprob of each token of ``token_ids`` given the ones before it (the first: NaN),
        at the current weights (with ``adapter``'s newest version under ``lora_mode: multi``);
        between decode steps."""
        if adapter is not None and adapter not in self._adapters:
            raise ValueError(f"adapter {adapter!r} is not loaded on this generator")
        async with self._step_lock:
            model = self._lanes[-1].engine.model
            slot = self._adapters[adapter][0] if adapter is not None else 0

            def run() -> list[float]:
                ids = torch.tensor([token_ids], device=next(model.parameters()).device)
                with torch.inference_mode():
                    if self._slots is not None:
                        self._slots.set_rows([slot])
                    logits = model(input_ids=ids).logits[0, :-1].float()
                    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
                return [float("nan"), *lp.cpu().tolist()]

            return await asyncio.to_thread(run)

    async def prompt_topk_logprobs(
        self, token_ids: list[int], k: int, adapter: str | None = None
    ) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """``prompt_logprobs`` plus, at each position after the first, the ``k`` most likely
        tokens given the ones before it and their logprobs, most likely first (float32 log
        softmax of the logits, as ``prompt_logprobs``): ``(logprobs, ids, topk_logprobs)``,
        the last two with ``len(token_ids) - 1`` rows."""
        if adapter is not None and adapter not in self._adapters:
            raise ValueError(f"adapter {adapter!r} is not loaded on this generator")
        async with self._step_lock:
            model = self._lanes[-1].engine.model
            slot = self._adapters[adapter][0] if adapter is not None else 0

            def run() -> tuple[list[float], list[list[int]], list[list[float]]]:
                ids = torch.tensor([token_ids], device=next(model.parameters()).device)
                with torch.inference_mode():
                    if self._slots is not None:
                        self._slots.set_rows([slot])
                    logits = model(input_ids=ids).logits[0, :-1].float()
                    all_lp = torch.log_softmax(logits, -1)
                    lp = all_lp.gather(-1, ids[0, 1:, None]).squeeze(-1)
                    top_lp, top_ids = all_lp.topk(k, dim=-1)
                return (
                    [float("nan"), *lp.cpu().tolist()],
                    top_ids.cpu().tolist(),
                    top_lp.cpu().tolist(),
                )

            return await asyncio.to_thread(run)

    def adapters(self) -> dict[str, int]:
        """``lora_mode: multi``: the loaded adapters and their versions."""
        return {name: version for name, (_, version) in self._adapters.items()}

    def _reset_lanes(self, lanes: list[Lane], error: Exception) -> None:
        """After a failed step: fail the lanes' requests and give each a fresh engine."""
        for lane in lanes:
            for future, _ in lane.futures.values():
                _fail(future, error)
            lane.futures.clear()
            lane.rows = 0
            lane.engine = self._new_engine(lane.engine.model, lane.version)
        if not any(lane.rows for lane in self._lanes):
            self._drained.set()

    def _retire_idle_lanes(self) -> None:
        old, current = self._lanes[:-1], self._lanes[-1]
        self._lanes = [lane for lane in old if lane.futures or lane.engine.has_work()]
        for lane in old:
            if lane not in self._lanes:
                lane.release()  # nothing computes with its version any more
        self._lanes.append(current)

    def stats(self) -> dict[str, Any]:
        counters = self._prefix_counters
        prefix = {
            name: counters[name]
            for name in (
                "prefix_hits",
                "prefix_misses",
                "prefix_reused_tokens",
                "prefill_tokens",
                "prefill_shared_rows",
                "prefill_common_tokens",
            )
        }
        prefix["prefix_cached_tokens"] = sum(
            lane.engine.prefix_cache_stats()["tokens"] for lane in self._lanes
        )
        return {
            **self._stats,
            **prefix,
            "asleep": self._asleep,
            "kv_cache_bytes": sum(lane.engine.kv_cache_bytes() for lane in self._lanes),
            "weight_bytes": tensor_bytes(self._lanes[-1].engine.model.state_dict().values())
            if self._lanes
            else 0,
            "version": self.version,
            "lanes": len(self._lanes),
            # Versions computed with in place from shared files (no copy), oldest lane first.
            "shared_versions": [lane.version for lane in self._lanes if lane.lease is not None],
            "running_rows": sum(lane.rows for lane in self._lanes),
            "queued": len(self._inbox),
            **(
                {"adapters": self.adapters(), "adapter_slots": self._slots.used}
                if self._slots is not None
                else {}
            ),
        }


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _step_lanes(lanes: list[Lane]) -> list[tuple[Lane, list[tuple[int, list[Completion]]]]]:
    """One decode step of every lane (runs in a worker thread, with its share of cores)."""
    threads.get_budget().rebalance()
    return [(lane, lane.engine.step()) for lane in lanes]
