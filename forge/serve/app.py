"""The HTTP routes of the Tinker API as the pinned ``tinker`` SDK calls them (``/api/v1/...``),
on ``ServerState``. Every route needs the server's API key in ``X-API-Key`` (a wrong or
missing key: 401, before the body is read); bodies are read through ``forge.serve.parse``
(a malformed field: 400 naming it; an oversized body or zstd output: 413). Queued calls (``create_model``,
``forward_backward``, ``optim_step``, ``save_weights*``, ``load_weights``, ``asample``)
answer a future at once and run in the background, a training client's calls in the order
the SDK numbered them; ``retrieve_future`` returns their results. A route the SDK has and
this server does not serve answers the API's error shape naming it."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from forge.serve import wire
from forge.serve.checkpoints import (
    CHECKPOINT_META,
    SAMPLER_DIR,
    base_of,
    checkpoint_meta,
    parse_path,
    write_checkpoint,
    write_sampler_weights,
)
from forge.serve.futures import FutureTable, UserError
from forge.serve.parse import (
    MODEL_ID_RE,
    NAME_RE,
    BodyTooLarge,
    Fields,
    Gate,
    adam_params,
    decompress,
    read_json,
    sampling_kwargs,
)
from forge.serve.state import SamplingSession, ServerState

__all__ = ["CHECKPOINT_META", "build_app", "checkpoint_meta", "write_checkpoint"]

logger = logging.getLogger("forge.serve")

CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "use_pyqwest_transport": False,
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
    "sample_enable_stuck_detection": False,
}
UNSUPPORTED_SAMPLE_FIELDS = {
    "topk_sample_logprobs": "top-k sample logprobs",
    "target_prompt_logprobs": "target prompt logprobs",
    "prompt_alt_tokens_k": "prompt alternative tokens",
    "record_stability_info": "stability info",
    "prompt_logprobs_last_n": "prompt logprobs of the last n tokens only",
}


def build_app(state: ServerState, api_key: str):
    """The FastAPI application serving ``state`` to clients holding ``api_key``."""
    app = FastAPI(title="forge serve (Tinker API)")
    futures = FutureTable(state.cfg.future_wait_s, state.stats)
    app.state.futures = futures

    @app.exception_handler(UserError)
    async def user_error(request: Request, e: UserError):
        return JSONResponse({"detail": str(e)}, status_code=400)

    @app.exception_handler(wire.WireError)
    async def wire_error(request: Request, e: wire.WireError):
        return JSONResponse({"detail": str(e)}, status_code=400)

    @app.exception_handler(BodyTooLarge)
    async def too_large(request: Request, e: BodyTooLarge):
        return JSONResponse({"detail": str(e)}, status_code=413)

    # The key, then the body's size, before any route runs.
    app.add_middleware(Gate, api_key=api_key, max_bytes=state.cfg.max_body_bytes)

    async def fields(request: Request) -> Fields:
        return read_json(await request.body())

    def model_of(body: Fields):
        return state.model(body.req_str("model_id", MODEL_ID_RE))

    def post(path: str):
        return app.post(f"/api/v1/{path}")

    # -- service ---------------------------------------------------------------------------

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {
            "supported_models": [
                {
                    "model_name": m.name,
                    "max_context_length": m.max_context_length,
                    "trainable": True,
                    "sampleable": True,
                }
                for m in state.cfg.models
            ]
        }

    @post("client/config")
    async def client_config():
        return CLIENT_CONFIG

    @post("client/dynamic_config")
    async def dynamic_config():
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @post("telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @post("create_session")
    async def create_session(request: Request):
        await fields(request)
        return {"type": "create_session", "session_id": state.new_session()}

    @post("session_heartbeat")
    async def heartbeat(request: Request):
        state.check_session((await fields(request)).req_str("session_id"))
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish_session(session_id: str, request: Request):
        reason = (await fields(request)).opt_obj("reason")
        kind = (reason.opt_str("type") if reason else None) or "success"
        if kind not in ("success", "errored", "interrupted"):
            raise UserError(f"finish reason {kind!r}: use success, errored or interrupted")
        state.finish_session(session_id, kind)
        return None

    # -- models ----------------------------------------------------------------------------

    @post("create_model")
    async def create_model(request: Request):
        body = await fields(request)
        session = body.req_str("session_id")
        state.check_session(session)
        optimizer = body.opt_obj("optimizer_config")
        kind = (optimizer.opt_str("type") if optimizer else None) or "adamw"
        if kind != "adamw":
            raise UserError(f"optimizer {kind!r} is not supported by this server (adamw only)")
        base, lora = body.req_str("base_model"), body.opt_obj("lora_config")
        model_id = f"{session}:train:{body.req_int('model_seq_id')}"  # the SDK's scheme

        async def work():
            await state.create_model(base, lora.body if lora else None, model_id)
            return {"model_id": model_id, "type": "create_model"}

        return futures.submit(work(), kind="create_model")

    @post("get_info")
    async def get_info(request: Request):
        m = model_of(await fields(request))
        return {
            "type": "get_info",
            "model_id": m.model_id,
            "model_name": m.base.name,
            "is_lora": True,
            "lora_rank": m.rank,
            "model_data": {"arch": "causal_lm", "model_name": m.base.name, "tokenizer_id": m.path},
        }

    # -- training --------------------------------------------------------------------------

    @post("forward_backward")
    async def forward_backward(request: Request):
        body = await request.body()
        encoding = request.headers.get("content-encoding")
        if encoding == "zstd":
            body = decompress(body, state.cfg.max_decompressed_bytes)
        elif encoding not in (None, "", "identity"):
            raise UserError(f"Content-Encoding {encoding!r} is not supported (zstd or none)")
        call = wire.decode_forward_backward(
            body, max(b.max_context_length for b in state.cfg.models)
        )
        if not MODEL_ID_RE.fullmatch(call.model_id):
            raise UserError(f"model_id {call.model_id[:60]!r} is not a model id of this server")
        m = state.model(call.model_id)
        wire.check_datum_tokens(call.datums, state.vocab_size(m.base.name), m.base.name)

        async def run():
            async with state.stats.timed("forward_backward"):
                outputs, metrics = await m.trainer.forward_backward_datums.call_one(
                    call.datums, call.loss_fn, call.loss_fn_config, call.forward_only
                )
            return wire.encode_forward_backward_output(outputs, metrics)

        return futures.submit(
            m.ordered(call.seq_id, run, state.cfg.order_wait_s), m.model_id, "forward_backward"
        )

    @post("optim_step")
    async def optim_step(request: Request):
        body = await fields(request)
        m = model_of(body)
        params = body.opt_obj("adam_params")
        if params is None:
            other = body.opt_obj("optimizer_params")
            kind = (other.opt_str("type") if other else None) or "?"
            raise UserError(f"optimizer params of type {kind!r} are not supported (Adam only)")
        adam = adam_params(params)

        async def run():
            async with state.stats.timed("optim_step"):
                metrics = await m.trainer.optim_step.call_one(adam)
            return {"type": "optim_step", "metrics": {f"{k}:mean": v for k, v in metrics.items()}}

        return futures.submit(
            m.ordered(body.opt_int("seq_id"), run, state.cfg.order_wait_s), m.model_id, "optim_step"
        )

    # -- weights ---------------------------------------------------------------------------

    @post("save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        body = await fields(request)
        m = model_of(body)
        name = body.opt_str("path", NAME_RE)
        seq = body.opt_int("sampling_session_seq_id")
        if name is None and seq is None:
            raise UserError("save_weights_for_sampler needs a name (path)")

        target = state.sampler_dir(m.model_id, name) if name is not None else None

        async def run():
            async with state.stats.timed("save_weights_for_sampler"):
                version, handle = await state.push_for_sampling(m)
                if target is not None:  # kept on disk: sampled after the client moves on
                    await write_sampler_weights(m, handle, target, state.cfg.lora_alpha)
            out = {"type": "save_weights_for_sampler"}
            path = None
            if name is not None:
                path = f"tinker://{m.model_id}/{SAMPLER_DIR}/{name}"
                m.samplers[path] = version
                out["path"] = path
            if seq is not None:
                session = SamplingSession(
                    m.generator, m.base.name, m.model_id, version, m.model_id, path
                )
                out["sampling_session_id"] = state.new_sampling_session(session)
            return out

        return futures.submit(
            m.ordered(body.opt_int("seq_id"), run, state.cfg.order_wait_s),
            m.model_id,
            "save_weights_for_sampler",
        )

    @post("save_weights")
    async def save_weights(request: Request):
        body = await fields(request)
        m = model_of(body)
        name = body.opt_str("path", NAME_RE) or f"step-{int(time.time())}"
        if name == SAMPLER_DIR:
            raise UserError(f"{SAMPLER_DIR!r} names where sampler weights go; pick another name")
        target = state.checkpoint_dir(m.model_id, name)
        if target.exists() and not body.opt_bool("overwrite"):
            raise UserError(f"checkpoint {name!r} of {m.model_id} exists; pass overwrite=True")

        async def run():
            async with state.stats.timed("save_weights"):
                await write_checkpoint(m, target, state.cfg.lora_alpha)
            return {"type": "save_weights", "path": f"tinker://{m.model_id}/weights/{name}"}

        return futures.submit(
            m.ordered(body.opt_int("seq_id"), run, state.cfg.order_wait_s),
            m.model_id,
            "save_weights",
        )

    @post("load_weights")
    async def load_weights(request: Request):
        body = await fields(request)
        tinker_path = body.req_str("path")
        source_id, kind, name = parse_path(tinker_path)
        if kind != "weights":
            raise UserError(
                f"{tinker_path!r} is not a save_state checkpoint (tinker://.../weights/...)"
            )
        source = state.checkpoint_dir(source_id, name)
        if not (source / CHECKPOINT_META).is_file():
            raise UserError(f"no checkpoint {tinker_path!r} on this server")
        weights_only = not body.opt_bool("optimizer")

        if body.has("model_id"):  # load_state on an existing training client
            m = model_of(body)

            async def run():
                async with state.stats.timed("load_weights"):
                    await m.trainer.load.call_one(str(source), weights_only)
                return {"type": "load_weights", "path": tinker_path, "model_id": m.model_id}

            return futures.submit(
                m.ordered(body.opt_int("seq_id"), run, state.cfg.order_wait_s),
                m.model_id,
                "load_weights",
            )

        # create_training_client_from_state: a new training client with the checkpoint's base
        # model and adapter layout, then its weights (and optimizer state, if asked).
        session = body.req_str("session_id")
        state.check_session(session)
        meta = checkpoint_meta(source)
        model_id = f"{session}:train:{body.req_int('model_seq_id')}"
        base = body.opt_str("base_model") or meta["base_model"]

        async def create():
            await state.create_model(base, meta["lora_config"], model_id)
            await state.model(model_id).trainer.load.call_one(str(source), weights_only)
            return {"type": "load_weights", "path": tinker_path, "model_id": model_id}

        return futures.submit(create(), model_id, "load_weights")

    # -- sampling --------------------------------------------------------------------------

    @post("create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await fields(request)
        state.check_session(body.req_str("session_id"))
        session = await state.sampling_for_path(
            body.opt_str("model_path"), body.opt_str("base_model")
        )
        return {
            "type": "create_sampling_session",
            "sampling_session_id": state.new_sampling_session(session),
        }

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        session = state.sampling.get(sampler_id)
        if session is None:
            raise UserError(f"unknown sampling session {sampler_id[:60]!r}")
        return {"sampler_id": sampler_id, "base_model": session.base, "model_path": session.path}

    @post("asample")
    async def asample(request: Request):
        body = await fields(request)
        for name, what in UNSUPPORTED_SAMPLE_FIELDS.items():
            if body.body.get(name):
                raise UserError(f"{what} ({name}) is not supported by this server")
        # Every field is checked before a base model's generator is spawned for the request.
        sid = body.opt_str("sampling_session_id")
        model_path, base_model = body.opt_str("model_path"), body.opt_str("base_model")
        session = None
        if sid is not None:
            if sid not in state.sampling:
                raise UserError(f"unknown sampling session {sid[:60]!r}")
            session = state.sampling[sid]
        elif base_model is None and model_path is None:
            raise UserError(
                "a sampling request needs a sampling_session_id, model_path or base_model"
            )
        if session is not None:
            base = session.base
        elif model_path is not None:
            base = base_of(state, model_path)  # reads the checkpoint's meta, loads nothing
        else:
            base = base_model
        try:
            context = state.cfg.base(base).max_context_length
        except KeyError as e:
            raise UserError(str(e.args[0])) from None
        prompt = wire.prompt_tokens(body.body.get("prompt"), "asample", context)
        n = body.opt_int("num_samples", 1, state.cfg.max_samples)
        params = body.opt_obj("sampling_params") or Fields({}, "sampling_params.")
        sampling = sampling_kwargs(
            params.body,
            1 if n is None else n,
            state.cfg.max_tokens,
            max_tokens_cap=context - len(prompt),
        )
        # Ids past the vocabulary are refused here, per request: in the generator's batch
        # one would fail every request decoded with it.
        vocab = state.vocab_size(base)
        wire.check_token_ids(prompt, vocab, "asample: prompt", base)
        stop_ids = [s for s in sampling.get("stop", ()) if not isinstance(s, str)]
        wire.check_token_ids(stop_ids, vocab, "asample: sampling_params.stop", base)
        with_prompt = body.opt_bool("prompt_logprobs")
        topk = prompt_topk(body, state.cfg.max_prompt_topk, vocab)
        if session is None:
            session = await state.sampling_for_path(model_path, base_model)
        work = sample(state, session, prompt, sampling, with_prompt, topk)
        out = futures.submit(work, kind="sample")
        out["sample_sequence_ids"] = [f"{out['request_id']}-{i}" for i in range(sampling["n"])]
        return out

    @post("retrieve_future")
    async def retrieve_future(request: Request):
        result = await futures.retrieve((await fields(request)).req_str("request_id"))
        if isinstance(result, bytes):
            return Response(result, media_type=wire.PROTO_CONTENT_TYPE)
        return result

    @app.get("/forge/v1/stats")
    async def stats():
        """Per kind of call: count, seconds submission-to-result, seconds in the actors."""
        return {"kinds": state.stats.kinds, "pending": futures.pending()}

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def unsupported(rest: str):
        return JSONResponse(
            {
                "detail": f"forge serve does not support /api/v1/{rest} (see docs/tinker.md "
                "for what it serves)"
            },
            status_code=404,
        )

    return app


def prompt_topk(body: Fields, limit: int, vocab: int) -> int:
    """The request's ``topk_prompt_logprobs`` (0: none), at most ``limit`` and the vocabulary."""
    k = body.body.get("topk_prompt_logprobs") or 0
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise UserError(f"topk_prompt_logprobs must be an integer >= 0, got {k!r}")
    if k > min(limit, vocab):
        raise UserError(
            f"topk_prompt_logprobs={k} is over this server's limit of {min(limit, vocab)} "
            f"(serve.max_prompt_topk={limit}, vocabulary {vocab}); ask for fewer"
        )
    return k


async def sample(
    state: ServerState,
    session: SamplingSession,
    prompt: list[int],
    sampling: dict,
    with_prompt: bool = False,
    topk: int = 0,
) -> bytes:
    """Sample at the session's version (and score the prompt, ``with_prompt``, with its
    ``topk`` most likely tokens at each position); protobuf ``SampleResponse`` bytes."""
    stop = sampling.pop("stop", None)
    if stop is not None:
        stop = _stop_strings(state, session, stop)
        if stop:
            sampling["stop"] = stop
    if session.model_id is not None:
        m = state.model(session.model_id)
        if session.version != m.version:
            if session.path is None:
                raise UserError(
                    f"this sampling client holds version {session.version} of {m.model_id}, "
                    f"but its training client saved version {m.version} since; weights saved "
                    "without a name are sampled only while they are the newest (save them "
                    "with a name, or create a sampling client for the new ones)"
                )
            # a named save: its copy on disk (forge.serve.checkpoints)
            session = await state.sampling_for_path(session.path, None)
    if session.adapter is not None:
        sampling["adapter"] = session.adapter
    prompt_lp = top = None
    async with state.stats.timed("sample"):
        if topk:  # top-k prompt logprobs (the cookbook's sdft), from the same weights
            prompt_lp, *top = await session.generator.prompt_topk_logprobs.route(
                prompt, topk, sampling.get("adapter")
            )
            prompt_lp = prompt_lp if with_prompt else None
        elif with_prompt:  # compute_logprobs: the prompt scored by the same weights
            prompt_lp = await session.generator.prompt_logprobs.route(
                prompt, sampling.get("adapter")
            )
        completions = await session.generator.generate.route(prompt, **sampling)
    if session.adapter is not None and any(
        c.generator_version != session.version for c in completions
    ):
        raise UserError("the weights changed while sampling; sample again from a new client")
    return wire.encode_sample_response(
        [
            (c.token_ids, c.logprobs, "length" if c.stop_reason == "length" else "stop")
            for c in completions
        ],
        prompt_lp,
        top,
        topk,
    )


def _stop_strings(state: ServerState, session: SamplingSession, stop: list) -> list[str]:
    """Stop strings for Forge's generator: token-id stops become their text; EOS is implicit."""
    if all(isinstance(s, str) for s in stop):
        return stop
    tok = state.tokenizer(session.base)
    out = []
    for s in stop:
        if isinstance(s, str):
            out.append(s)
        elif int(s) != tok.eos_token_id:
            text = tok.decode([int(s)])
            if not text:
                raise UserError(f"stop token {s} decodes to no text; this server stops on strings")
            out.append(text)
    return out
