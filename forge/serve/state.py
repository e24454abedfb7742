"""What ``forge serve`` holds: sessions, training clients (each a LoRA ``Trainer`` actor and a
``Generator`` service over one base model), sampling sessions (a generator at a weight
version) and the checkpoints loaded for sampling (``forge.serve.checkpoints``), and the
operations the Tinker routes run on them."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import forge.settings
from forge.serve.checkpoints import SAMPLER_DIR, load_for_sampling, parse_path
from forge.serve.futures import Stats, UserError
from forge.serve.serve_config import ServeConfig, ServedBase, resolve_path

logger = logging.getLogger("forge.serve")

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class SamplingSession:
    """Samples from ``generator`` with ``adapter`` at ``version`` (``adapter`` None: the base
    model). ``model_id``: the training client whose newest saved weights these are (None for
    the base and for checkpoints loaded from disk); ``path``: the ``tinker://`` sampler path
    they were saved under, if named, which samples from disk once the client saves again."""

    generator: Any
    base: str
    model_id: str | None
    version: int
    adapter: str | None = None
    path: str | None = None  # the tinker:// path sampled, if any


@dataclass
class ServedModel:
    """One training client: a LoRA adapter over ``base``, trained by ``trainer`` and sampled
    by ``generator`` (which holds the newest version saved for sampling)."""

    model_id: str
    base: ServedBase
    path: str
    rank: int
    trainer: Any
    generator: Any
    lora_request: dict = field(default_factory=dict)  # the API's lora_config, for checkpoints
    version: int = 0  # the newest version pushed to the generator
    samplers: dict[str, int] = field(default_factory=dict)  # tinker path -> version
    _next_seq: int = 1
    _cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def ordered(self, seq_id: int | None, work, wait_s: float):
        """Run ``work()`` after the requests the client numbered before ``seq_id`` (the SDK
        numbers a training client's requests and expects them run in that order), one at a
        time; a gap in the numbers is waited for at most ``wait_s``."""
        if seq_id is not None:
            async with self._cond:
                try:
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: self._next_seq >= seq_id), wait_s
                    )
                except asyncio.TimeoutError:
                    logger.warning(
                        "%s: request %d ran before %d..%d, which never came",
                        self.model_id,
                        seq_id,
                        self._next_seq,
                        seq_id - 1,
                    )
        async with self._lock:
            try:
                return await work()
            finally:
                if seq_id is not None:
                    async with self._cond:
                        self._next_seq = max(self._next_seq, seq_id + 1)
                        self._cond.notify_all()


class ServerState:
    """Sessions, models and sampling sessions of one server process."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.sessions: set[str] = set()
        self.finished: dict[str, str] = {}  # session id -> finish reason (first wins)
        self.models: dict[str, ServedModel] = {}
        self.sampling: dict[str, SamplingSession] = {}
        self.base_generators: dict[str, Any] = {}
        self._tokenizers: dict[str, Any] = {}
        self._vocab_sizes: dict[str, int] = {}
        self._spawn_lock = asyncio.Lock()
        self._creating = 0  # training clients being spawned (counted against max_models)
        self.stats = Stats()
        self.checkpoints: dict[str, Any] = {}  # tinker path -> checkpoints.LoadedCheckpoint
        self.checkpoint_lock = asyncio.Lock()
        self._checkpoint_store = None
        self._checkpoint_version = 0

    # -- sessions ---------------------------------------------------------------------------

    def new_session(self) -> str:
        sid = f"session-{uuid.uuid4().hex[:12]}"
        self.sessions.add(sid)
        return sid

    def check_session(self, session_id: str) -> None:
        if session_id not in self.sessions:
            raise UserError(f"unknown session {session_id!r}; create one with create_session")
        if session_id in self.finished:
            raise UserError(
                f"session {session_id!r} is finished ({self.finished[session_id]}); "
                "create a new one with create_session"
            )

    def finish_session(self, session_id: str, reason: str) -> None:
        """Mark a session terminal (the SDK's ``ServiceClient.close``); the first reason wins.
        Its models stay served to other sessions' clients that hold their ids."""
        if session_id not in self.sessions:
            raise UserError(f"unknown session {session_id!r}; create one with create_session")
        self.finished.setdefault(session_id, reason)

    def model(self, model_id: str) -> ServedModel:
        if model_id not in self.models:
            raise UserError(f"unknown model_id {model_id!r} (a restarted server forgets models)")
        return self.models[model_id]

    # -- spawning ---------------------------------------------------------------------------

    def _env_vars(self) -> dict[str, str]:
        from forge.run import actor_env_vars

        return actor_env_vars(self.cfg.threads_per_actor)

    def lora_for(self, lora: dict | None, base: ServedBase):
        """Forge's ``LoraConfig`` for the API's ``lora_config`` (rank and the layer groups)."""
        from forge.training.trainer_config import LoraConfig

        lora = dict(lora or {})
        rank = int(lora.pop("rank", 32))
        seed = lora.pop("seed", None)
        attn, mlp = lora.pop("train_attn", True), lora.pop("train_mlp", True)
        unembed = lora.pop("train_unembed", True)
        if lora:
            raise UserError(f"lora_config keys {sorted(lora)} are not supported by this server")
        if not 1 <= rank <= self.cfg.max_lora_rank:
            raise UserError(
                f"LoRA rank {rank} is outside 1..{self.cfg.max_lora_rank} (serve.max_lora_rank)"
            )
        targets = (ATTN if attn else ()) + (MLP if mlp else ()) + (("lm_head",) if unembed else ())
        if not targets:
            raise UserError(
                "train_attn, train_mlp and train_unembed are all False: nothing to train"
            )
        return LoraConfig(rank=rank, alpha=self.cfg.lora_alpha, target_modules=targets), seed

    async def create_model(self, base_name: str, lora: dict | None, model_id: str) -> str:
        """Spawn a trainer and a generator for a new adapter over ``base_name``."""
        from forge.actors import Trainer
        from forge.training import TrainerConfig
        from forge.weights import WeightTransportConfig

        try:
            base = self.cfg.base(base_name)
        except KeyError as e:
            raise UserError(str(e.args[0])) from None
        lora_cfg, seed = self.lora_for(lora, base)
        async with self._spawn_lock:
            if len(self.models) + self._creating >= self.cfg.max_models:
                raise UserError(
                    f"this server already holds {len(self.models)} training clients "
                    f"(serve.max_models); start it with a larger max_models"
                )
            if model_id in self.models:
                raise UserError(f"model {model_id!r} exists already")
            self._creating += 1
            path = resolve_path(base)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "-", model_id)  # ids hold ':'; file names do not
            weights = WeightTransportConfig(prefix=f"serve-{safe}", keep_last=2)
            tcfg = TrainerConfig(
                model=path,
                lora=lora_cfg,
                weights=weights,
                device=self.cfg.device,
                autocast=self.cfg.autocast,
                seed=0 if seed is None else int(seed),
            )
            env_vars = self._env_vars()
            logger.info("%s: spawning a trainer (%s, rank %d)", model_id, base.name, lora_cfg.rank)
        try:
            # The base's one generator service serves every adapter over that base.
            trainer, generator = await asyncio.gather(
                Trainer.options(procs=1, env_vars=env_vars, mesh_name=f"trainer-{safe}").as_actor(
                    tcfg
                ),
                self.base_generator(base.name),
            )
            # every call to the trainer that names no timeout is bounded (FORGE_CALL_TIMEOUT_S):
            # a trainer that stops answering fails its request instead of holding it for good
            trainer = trainer.with_default_timeout(forge.settings.get_call_timeout_s())
            self.models[model_id] = ServedModel(
                model_id, base, path, lora_cfg.rank, trainer, generator, dict(lora or {})
            )
        finally:
            self._creating -= 1
        return model_id

    async def base_generator(self, base_name: str):
        """The one generator service of a base model (spawned on first use): the base loaded
        once, every training client's adapter served next to the others on it
        (``lora_mode: multi``, per-row LoRA), the base itself for requests naming none."""
        from forge.actors import Generator
        from forge.generation.backend import GeneratorConfig

        try:
            base = self.cfg.base(base_name)
        except KeyError as e:
            raise UserError(str(e.args[0])) from None
        async with self._spawn_lock:
            if base_name not in self.base_generators:
                cfg = GeneratorConfig(
                    model=resolve_path(base),
                    device=self.cfg.device,
                    dtype=self.cfg.dtype,
                    max_batch_size=self.cfg.max_batch_size,
                    lora_mode="multi",
                )
                self.base_generators[base_name] = await Generator.options(
                    num_replicas=1, env_vars=self._env_vars()
                ).as_service(cfg)
        return self.base_generators[base_name]

    def tokenizer(self, base_name: str):
        """The tokenizer of a base model, loaded once (a load takes ~0.3 s of CPU; sampling
        requests with token-id stops need it every time)."""
        if base_name not in self._tokenizers:
            from forge.models import load_tokenizer

            self._tokenizers[base_name] = load_tokenizer(resolve_path(self.cfg.base(base_name)))
        return self._tokenizers[base_name]

    def vocab_size(self, base_name: str) -> int:
        """How many token ids a base model's embedding has (its config's ``vocab_size``),
        read once: requests are checked against it before they reach a batch."""
        if base_name not in self._vocab_sizes:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(resolve_path(self.cfg.base(base_name)))
            self._vocab_sizes[base_name] = int(config.get_text_config().vocab_size)
        return self._vocab_sizes[base_name]

    # -- weights ----------------------------------------------------------------------------

    async def push_for_sampling(self, m: ServedModel) -> tuple[int, Any]:
        """Publish the trainer's adapter as a new version and load it into the generator;
        the version and its ``WeightHandle``."""
        version = m.version + 1
        handle = await m.trainer.push_weights.call_one(version)
        await m.generator.load_adapter.fanout(m.model_id, handle)
        m.version = version
        return version, handle

    def checkpoint_store(self):
        """The ``WeightStore`` that hands checkpoints read from disk to generators (made on
        first use; a version is dropped once the next is pushed, after its generator
        copied it)."""
        if self._checkpoint_store is None:
            from forge.weights import WeightStore, WeightTransportConfig, build_transport

            transport = build_transport(WeightTransportConfig(prefix="serve-checkpoints"))
            self._checkpoint_store = WeightStore(transport, keep_last=1)
        return self._checkpoint_store

    def next_checkpoint_version(self) -> int:
        self._checkpoint_version += 1
        return self._checkpoint_version

    def new_sampling_session(self, session: SamplingSession) -> str:
        sid = f"sampler-{uuid.uuid4().hex[:12]}"
        self.sampling[sid] = session
        return sid

    async def sampling_for_path(
        self, model_path: str | None, base_model: str | None
    ) -> SamplingSession:
        """A sampling session for a ``tinker://`` path or a base model: a training client's
        newest save for sampling is sampled where it is; any other named save, or a
        ``save_state`` checkpoint, is loaded from disk (``forge.serve.checkpoints``)."""
        if model_path:
            model_id = parse_path(model_path)[0]
            m = self.models.get(model_id)
            if m is not None and m.samplers.get(model_path) == m.version:
                return SamplingSession(
                    m.generator, m.base.name, model_id, m.version, model_id, model_path
                )
            ckpt = await load_for_sampling(self, model_path)
            generator = await self.base_generator(ckpt.base)
            return SamplingSession(
                generator, ckpt.base, None, ckpt.version, ckpt.adapter, model_path
            )
        if not base_model:
            raise UserError("a sampling client needs a model_path or a base_model")
        return SamplingSession(await self.base_generator(base_model), base_model, None, 0)

    def checkpoint_dir(self, model_id: str, name: str) -> Path:
        """``<serve.dir>/<model_id>/<name>``: both plain names, and the resolved path (links
        followed) inside the server's directory, or ``UserError``."""
        from forge.serve.parse import MODEL_ID_RE, NAME_RE

        if not MODEL_ID_RE.fullmatch(model_id):
            raise UserError(f"model id {model_id[:60]!r} is not a model id of this server")
        if not NAME_RE.fullmatch(name):
            raise UserError(
                f"checkpoint name {name[:60]!r}: use a plain name (letters, digits, '_.+-'; "
                "no '/', not starting with '.')"
            )
        root = Path(self.cfg.dir).resolve()
        path = (root / model_id / name).resolve()
        if root not in path.parents:
            raise UserError(f"checkpoint {model_id}/{name} is outside this server's directory")
        return path

    def sampler_dir(self, model_id: str, name: str) -> Path:
        """``<serve.dir>/<model_id>/sampler_weights/<name>``, checked as ``checkpoint_dir``."""
        self.checkpoint_dir(model_id, name)  # the name's checks
        return self.checkpoint_dir(model_id, SAMPLER_DIR) / name

    async def close(self) -> None:
        """Drop pushed weight files (the controller's shutdown stops the processes)."""
        if self._checkpoint_store is not None:
            self._checkpoint_store.close()
        for m in self.models.values():
            try:
                await asyncio.wait_for(m.trainer.close.call_one(), 10)
            except Exception as e:  # noqa: BLE001 - best effort while shutting down
                logger.warning("%s: closing the trainer failed: %s", m.model_id, e)
