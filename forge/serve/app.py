"""The HTTP routes of the Tinker API as the pinned ``tinker`` SDK calls them (``/api/v1/...``),
on ``ServerState``. Every route needs the server's API key in ``X-API-Key`` (a wrong or
missing key: 401, before the body is read). Queued calls (``create_model``,
``forward_backward``, ``optim_step``, ``save_weights*``, ``load_weights``, ``asample``)
answer a future at once and run in the background, a training client's calls in the order
the SDK numbered them; ``retrieve_future`` returns their results. A route the SDK has and
this server does not serve answers the API's error shape naming it."""

from __future__ import annotations

import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from forge.serve import wire
from forge.serve.futures import FutureTable, UserError
from forge.serve.state import SamplingSession, ServerState, parse_path

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
CHECKPOINT_META = "forge_serve.json"  # a save_state checkpoint's base model and lora_config
UNSUPPORTED_SAMPLE_FIELDS = {
    "topk_prompt_logprobs": "top-k prompt logprobs",
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
    key = api_key.encode()

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        given = request.headers.get("x-api-key", "").encode()
        if not hmac.compare_digest(given, key):
            return JSONResponse(
                {"detail": "invalid or missing API key (X-API-Key): give the key forge serve "
                 "was started with (--api-key or FORGE_API_KEY)"},
                status_code=401,
            )  # fmt: skip
        return await call_next(request)

    @app.exception_handler(UserError)
    async def user_error(request: Request, e: UserError):
        return JSONResponse({"detail": str(e)}, status_code=400)

    def post(path: str):
        return app.post(f"/api/v1/{path}")

    # -- service ---------------------------------------------------------------------------

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return {"supported_models": [
            {"model_name": m.name, "max_context_length": m.max_context_length,
             "trainable": True, "sampleable": True} for m in state.cfg.models
        ]}  # fmt: skip

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
        await request.json()
        return {"type": "create_session", "session_id": state.new_session()}

    @post("session_heartbeat")
    async def heartbeat(request: Request):
        state.check_session((await request.json())["session_id"])
        return {"type": "session_heartbeat"}

    # -- models ----------------------------------------------------------------------------

    @post("create_model")
    async def create_model(request: Request):
        body = await request.json()
        state.check_session(body["session_id"])
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UserError(f"optimizer {optimizer!r} is not supported by this server (adamw only)")

        async def work():
            model_id = f"{body['session_id']}:train:{body['model_seq_id']}"  # the SDK's scheme
            await state.create_model(body["base_model"], body.get("lora_config"), model_id)
            return {"model_id": model_id, "type": "create_model"}

        return futures.submit(work(), kind="create_model")

    @post("get_info")
    async def get_info(request: Request):
        m = state.model((await request.json())["model_id"])
        return {
            "type": "get_info", "model_id": m.model_id, "model_name": m.base.name,
            "is_lora": True, "lora_rank": m.rank,
            "model_data": {"arch": "causal_lm", "model_name": m.base.name, "tokenizer_id": m.path},
        }  # fmt: skip

    # -- training --------------------------------------------------------------------------

    @post("forward_backward")
    async def forward_backward(request: Request):
        body = await request.body()
        if request.headers.get("content-encoding") == "zstd":
            import zstandard

            body = zstandard.ZstdDecompressor().decompress(body)
        call = wire.decode_forward_backward(body)
        m = state.model(call.model_id)

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
        body = await request.json()
        m = state.model(body["model_id"])
        params = body.get("adam_params")
        if params is None:
            kind = (body.get("optimizer_params") or {}).get("type", "?")
            raise UserError(f"optimizer params of type {kind!r} are not supported (Adam only)")
        adam = {k: v for k, v in params.items() if k != "type"}
        defaults = dict(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12,
                        weight_decay=0.0, grad_clip_norm=0.0)  # fmt: skip
        adam = {**defaults, **adam}

        async def run():
            async with state.stats.timed("optim_step"):
                metrics = await m.trainer.optim_step.call_one(adam)
            return {"type": "optim_step", "metrics": {f"{k}:mean": v for k, v in metrics.items()}}

        return futures.submit(
            m.ordered(body.get("seq_id"), run, state.cfg.order_wait_s), m.model_id, "optim_step"
        )

    # -- weights ---------------------------------------------------------------------------

    @post("save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        body = await request.json()
        m = state.model(body["model_id"])
        if body.get("path") is None and body.get("sampling_session_seq_id") is None:
            raise UserError("save_weights_for_sampler needs a name (path)")

        async def run():
            async with state.stats.timed("save_weights_for_sampler"):
                version = await state.push_for_sampling(m)
            out = {"type": "save_weights_for_sampler"}
            if body.get("path") is not None:
                path = f"tinker://{m.model_id}/sampler_weights/{body['path']}"
                m.samplers[path] = version
                out["path"] = path
            if body.get("sampling_session_seq_id") is not None:
                session = SamplingSession(m.generator, m.base.name, m.model_id, version)
                out["sampling_session_id"] = state.new_sampling_session(session)
            return out

        return futures.submit(
            m.ordered(body.get("seq_id"), run, state.cfg.order_wait_s),
            m.model_id,
            "save_weights_for_sampler",
        )

    @post("save_weights")
    async def save_weights(request: Request):
        body = await request.json()
        m = state.model(body["model_id"])
        name = body.get("path") or f"step-{int(time.time())}"
        target = state.checkpoint_dir(m.model_id, name)
        if target.exists() and not body.get("overwrite"):
            raise UserError(f"checkpoint {name!r} of {m.model_id} exists; pass overwrite=True")

        async def run():
            async with state.stats.timed("save_weights"):
                await m.trainer.save.call_one(str(target))
            meta = {"base_model": m.base.name, "lora_config": m.lora_request}
            (target / CHECKPOINT_META).write_text(json.dumps(meta))
            return {"type": "save_weights", "path": f"tinker://{m.model_id}/weights/{name}"}

        return futures.submit(
            m.ordered(body.get("seq_id"), run, state.cfg.order_wait_s), m.model_id, "save_weights"
        )

    @post("load_weights")
    async def load_weights(request: Request):
        body = await request.json()
        source_id, kind, name = parse_path(body["path"])
        if kind != "weights":
            raise UserError(
                f"{body['path']!r} is not a save_state checkpoint (tinker://.../weights/...)"
            )
        source = state.checkpoint_dir(source_id, name)
        if not (source / CHECKPOINT_META).is_file():
            raise UserError(f"no checkpoint {body['path']!r} on this server")
        weights_only = not body.get("optimizer", False)

        if body.get("model_id") is not None:  # load_state on an existing training client
            m = state.model(body["model_id"])

            async def run():
                async with state.stats.timed("load_weights"):
                    await m.trainer.load.call_one(str(source), weights_only)
                return {"type": "load_weights", "path": body["path"], "model_id": m.model_id}

            return futures.submit(
                m.ordered(body.get("seq_id"), run, state.cfg.order_wait_s),
                m.model_id,
                "load_weights",
            )

        # create_training_client_from_state: a new training client with the checkpoint's base
        # model and adapter layout, then its weights (and optimizer state, if asked).
        state.check_session(body["session_id"])
        meta = json.loads((source / CHECKPOINT_META).read_text())
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"

        async def create():
            base = body.get("base_model") or meta["base_model"]
            await state.create_model(base, meta["lora_config"], model_id)
            await state.model(model_id).trainer.load.call_one(str(source), weights_only)
            return {"type": "load_weights", "path": body["path"], "model_id": model_id}

        return futures.submit(create(), model_id, "load_weights")

    # -- sampling --------------------------------------------------------------------------

    @post("create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await request.json()
        state.check_session(body["session_id"])
        session = await state.sampling_for_path(body.get("model_path"), body.get("base_model"))
        return {"type": "create_sampling_session",
                "sampling_session_id": state.new_sampling_session(session)}  # fmt: skip

    @post("asample")
    async def asample(request: Request):
        body = await request.json()
        for name, what in UNSUPPORTED_SAMPLE_FIELDS.items():
            if body.get(name):
                raise UserError(f"{what} ({name}) is not supported by this server")
        sid = body.get("sampling_session_id")
        if sid is not None:
            if sid not in state.sampling:
                raise UserError(f"unknown sampling session {sid!r}")
            session = state.sampling[sid]
        else:
            session = await state.sampling_for_path(body.get("model_path"), body.get("base_model"))
        prompt = wire.prompt_tokens(body["prompt"], "asample")
        sampling = sampling_kwargs(body.get("sampling_params") or {}, int(body.get("num_samples", 1)),
                                   state.cfg.max_tokens)  # fmt: skip
        with_prompt = bool(body.get("prompt_logprobs"))
        out = futures.submit(sample(state, session, prompt, sampling, with_prompt), kind="sample")
        out["sample_sequence_ids"] = [f"{out['request_id']}-{i}" for i in range(sampling["n"])]
        return out

    @post("retrieve_future")
    async def retrieve_future(request: Request):
        result = await futures.retrieve((await request.json())["request_id"])
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
            {"detail": f"forge serve does not support /api/v1/{rest} (see docs/tinker.md "
             "for what it serves)"},
            status_code=404,
        )  # fmt: skip

    return app


def sampling_kwargs(params: dict, n: int, default_max_tokens: int) -> dict:
    """Forge ``generate`` keywords for the API's ``SamplingParams``."""
    params = dict(params)
    stop = params.pop("stop", None)
    out = {
        "n": n,
        "max_tokens": params.pop("max_tokens", None) or default_max_tokens,
        "temperature": float(params.pop("temperature", 1.0)),
        "top_p": float(params.pop("top_p", 1.0)),
        "top_k": max(0, int(params.pop("top_k", -1))),
        "seed": params.pop("seed", None),
    }
    if params:
        raise UserError(f"sampling parameters {sorted(params)} are not supported by this server")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not stop:
            raise UserError(
                "stop=[] (no stop at all, not even EOS) is not supported by this server"
            )
        out["stop"] = list(stop)
    return out


async def sample(
    state: ServerState,
    session: SamplingSession,
    prompt: list[int],
    sampling: dict,
    with_prompt: bool = False,
) -> bytes:
    """Sample at the session's version (and score the prompt, ``with_prompt``); protobuf
    ``SampleResponse`` bytes."""
    stop = sampling.pop("stop", None)
    if stop is not None:
        stop = _stop_strings(state, session, stop)
        if stop:
            sampling["stop"] = stop
    if session.model_id is not None:
        m = state.model(session.model_id)
        if session.version != m.version:
            raise UserError(
                f"this sampling client holds version {session.version} of {m.model_id}, but its "
                f"generator moved on to version {m.version}; this server samples only the newest "
                "weights saved for sampling (create a sampling client for them)"
            )
    if session.model_id is not None:
        sampling["adapter"] = session.model_id
    prompt_lp = None
    async with state.stats.timed("sample"):
        if with_prompt:  # compute_logprobs: the prompt scored by the same weights
            prompt_lp = await session.generator.prompt_logprobs.route(
                prompt, sampling.get("adapter")
            )
        completions = await session.generator.generate.route(prompt, **sampling)
    if session.model_id is not None and any(
        c.generator_version != session.version for c in completions
    ):
        raise UserError("the weights changed while sampling; sample again from a new client")
    return wire.encode_sample_response(
        [
            (c.token_ids, c.logprobs, "length" if c.stop_reason == "length" else "stop")
            for c in completions
        ],
        prompt_lp,
    )


def _stop_strings(state: ServerState, session: SamplingSession, stop: list) -> list[str]:
    """Stop strings for Forge's generator: token-id stops become their text; EOS is implicit."""
    if all(isinstance(s, str) for s in stop):
        return stop
    from forge.models import load_tokenizer
    from forge.serve.config import resolve_path

    tok = load_tokenizer(resolve_path(state.cfg.base(session.base)))
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
