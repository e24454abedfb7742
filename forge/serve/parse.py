"""Reading ``forge serve`` request bodies: size caps, JSON, zstd, and typed fields.

Every route reads its body through here, so a malformed request is answered 400 naming the
field and what it must be (never a 500 from a ``KeyError`` deep in a route), and an
oversized one 413:

- ``Gate`` (ASGI middleware): the API key is checked before anything is read; a
  ``Content-Length`` above ``serve.max_body_bytes`` is refused unread, and a body streamed
  past it stops being read there;
- ``decompress``: zstd output is read to ``serve.max_decompressed_bytes`` at most (a small
  body cannot expand into gigabytes);
- ``Fields``: typed accessors over a JSON object (``req_str``, ``opt_int``, ...).

Names (model ids, checkpoint names) are checked against ``NAME_RE`` / ``MODEL_ID_RE``
before they come near a path (``ServerState.checkpoint_dir`` also checks containment).
"""

from __future__ import annotations

import hmac
import io
import json
import math
import re
from typing import Any

from forge.serve.futures import UserError

__all__ = [
    "BadRequest",
    "Gate",
    "BodyTooLarge",
    "Fields",
    "adam_params",
    "decompress",
    "read_json",
    "sampling_kwargs",
]

# A checkpoint or sampler name, and a model id (the SDK's "<session>:train:<n>"): no '/', no
# leading '.', so neither can step out of the server's directory.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
MODEL_ID_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,127}")
MAX_STOP = 16  # stop sequences per request
MAX_STOP_CHARS = 256  # characters per stop string


class BadRequest(UserError):
    """A request body or field this server cannot use (answered 400, naming the field)."""


class BodyTooLarge(UserError):
    """A request body (or its decompressed form) past the server's cap (answered 413)."""


class Gate:
    """ASGI middleware in front of every route: the API key first (401, nothing read), then
    the body, read whole up to ``max_bytes`` (413 past it, whether ``Content-Length`` says
    so up front or a streamed body passes it), then the route, which reads it from memory.
    """

    def __init__(self, app, api_key: str, max_bytes: int) -> None:
        self.app, self.key, self.max_bytes = app, api_key.encode(), max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from fastapi.responses import JSONResponse

        headers = dict(scope["headers"])
        if not hmac.compare_digest(headers.get(b"x-api-key", b""), self.key):
            detail = (
                "invalid or missing API key (X-API-Key): give the key forge serve was "
                "started with (--api-key or FORGE_API_KEY)"
            )
            return await JSONResponse({"detail": detail}, status_code=401)(scope, receive, send)
        too_large = JSONResponse(
            {
                "detail": f"the request body is over this server's limit of {self.max_bytes} "
                "bytes (serve.max_body_bytes)"
            },
            status_code=413,
        )
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await too_large(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await too_large(scope, receive, send)
            if not message.get("more_body", False):
                break
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        return await self.app(scope, replay, send)


def decompress(body: bytes, max_bytes: int) -> bytes:
    """A zstd body, decompressed to at most ``max_bytes``."""
    import zstandard

    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
            out = reader.read(max_bytes + 1)
    except zstandard.ZstdError as e:
        raise BadRequest(f"the body is not valid zstd (Content-Encoding: zstd): {e}") from None
    if len(out) > max_bytes:
        raise BodyTooLarge(
            f"the zstd body decompresses to over {max_bytes} bytes (serve.max_decompressed_bytes)"
        )
    return out


def read_json(raw: bytes) -> Fields:
    """A JSON object body as ``Fields``."""
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError) as e:
        raise BadRequest(f"the body is not JSON: {str(e)[:200]}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return Fields(body)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


class Fields:
    """Typed access to a JSON object's fields; a missing or mistyped one is ``BadRequest``
    naming it (``where``: the path of the object, e.g. ``sampling_params.``)."""

    def __init__(self, body: dict, where: str = "") -> None:
        self.body, self.where = body, where

    def has(self, name: str) -> bool:
        return self.body.get(name) is not None

    def _bad(self, name: str, what: str, value: Any) -> BadRequest:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return BadRequest(f"field '{self.where}{name}' must be {what}, got {shown}")

    def _get(self, name: str, required: bool) -> Any:
        if name not in self.body or self.body[name] is None:
            if required:
                raise BadRequest(f"field '{self.where}{name}' is required")
            return None
        return self.body[name]

    def req_str(self, name: str, pattern: re.Pattern | None = None) -> str:
        return self.opt_str(name, pattern, required=True)  # type: ignore[return-value]

    def opt_str(
        self, name: str, pattern: re.Pattern | None = None, required: bool = False
    ) -> str | None:
        value = self._get(name, required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self._bad(name, "a string", value)
        if pattern is not None and not pattern.fullmatch(value):
            raise self._bad(
                name, f"a plain name (letters, digits, {_punct(pattern)}; at most 128)", value
            )
        return value

    def req_int(self, name: str, lo: int = 0, hi: int = 2**31 - 1) -> int:
        return self.opt_int(name, lo, hi, required=True)  # type: ignore[return-value]

    def opt_int(
        self, name: str, lo: int = 0, hi: int = 2**31 - 1, required: bool = False
    ) -> int | None:
        value = self._get(name, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self._bad(name, f"an integer in {lo}..{hi}", value)
        return value

    def opt_float(self, name: str, lo: float, hi: float) -> float | None:
        value = self._get(name, False)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._bad(name, f"a number in [{lo}, {hi}]", value)
        if not (math.isfinite(value) and lo <= value <= hi):
            raise self._bad(name, f"a number in [{lo}, {hi}]", value)
        return float(value)

    def opt_bool(self, name: str) -> bool:
        value = self._get(name, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self._bad(name, "true or false", value)
        return value

    def opt_obj(self, name: str) -> Fields | None:
        value = self._get(name, False)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self._bad(name, "an object", value)
        return Fields(value, f"{self.where}{name}.")

    def opt_list(self, name: str) -> list | None:
        value = self._get(name, False)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self._bad(name, "a list", value)
        return value


def _punct(pattern: re.Pattern) -> str:
    return "'_ . + - :'" if ":" in pattern.pattern else "'_ . + -'"


def sampling_kwargs(
    params: dict, n: int, default_max_tokens: int, max_tokens_cap: int | None = None
) -> dict:
    """Forge ``generate`` keywords for the API's ``SamplingParams`` (each field checked:
    ``BadRequest`` names a mistyped or out-of-range one); ``max_tokens_cap``: the most
    tokens the prompt leaves in the base model's context."""
    f = Fields(dict(params), "sampling_params.")
    known = {"stop", "max_tokens", "temperature", "top_p", "top_k", "seed"}
    unknown = sorted(set(f.body) - known)
    if unknown:
        raise UserError(f"sampling parameters {unknown} are not supported by this server")
    cap = 2**31 - 1 if max_tokens_cap is None else max_tokens_cap
    if cap < 1:
        raise UserError("the prompt fills the base model's context (max_context_length)")
    top_k = f.opt_int("top_k", -1)
    out = {
        "n": n,
        "max_tokens": f.opt_int("max_tokens", 1, cap) or min(default_max_tokens, cap),
        "temperature": f.opt_float("temperature", 0.0, 1e4) if f.has("temperature") else 1.0,
        "top_p": f.opt_float("top_p", 0.0, 1.0) if f.has("top_p") else 1.0,
        "top_k": max(0, -1 if top_k is None else top_k),
        "seed": f.opt_int("seed", -(2**63), 2**63 - 1),
    }
    stop = f.body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list):
            raise UserError("field 'sampling_params.stop' must be a string or a list")
        if not stop:
            raise UserError(
                "stop=[] (no stop at all, not even EOS) is not supported by this server"
            )
        if len(stop) > MAX_STOP or not all(_stop_ok(s) for s in stop):
            raise UserError(
                f"field 'sampling_params.stop' must hold at most {MAX_STOP} strings of at most "
                f"{MAX_STOP_CHARS} characters or token ids"
            )
        out["stop"] = list(stop)
    return out


def _stop_ok(s) -> bool:
    if isinstance(s, str):
        return 0 < len(s) <= MAX_STOP_CHARS
    return isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31


def adam_params(params: Fields) -> dict:
    """Adam's settings from the API's ``AdamParams`` (defaults as the SDK's)."""
    defaults = dict(
        learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12, weight_decay=0.0, grad_clip_norm=0.0
    )
    unknown = sorted(set(params.body) - set(defaults) - {"type"})
    if unknown:
        raise UserError(f"adam_params {unknown} are not supported by this server")
    ranges = {"beta1": (0.0, 1.0), "beta2": (0.0, 1.0)}
    out = {}
    for k, default in defaults.items():
        value = params.opt_float(k, *ranges.get(k, (0.0, 1e6)))
        out[k] = default if value is None else value
    return out
