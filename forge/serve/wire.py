"""The Tinker API's binary bodies: forward/backward requests in, forward/backward outputs and
samples out, as protobuf messages of the pinned ``tinker`` SDK's own schema
(``tinker.proto.tinker_public_pb2``), so the server reads and writes exactly what that SDK
version writes and reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

PROTO_CONTENT_TYPE = "application/x-protobuf"


class WireError(ValueError):
    """A request body this server cannot use (the caller's mistake or an unsupported input)."""


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


@dataclass
class ForwardBackwardCall:
    """A decoded ``/api/v1/forward_backward`` body; ``datums`` as ``forge.training.datums``
    takes them."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict
    forward_only: bool
    datums: list[dict]


MAX_TENSOR_ELEMENTS = 1 << 24  # a loss input holds one value per token; a sparse one's shape
# says how large it becomes once dense, so that is checked before it is made dense


def _tensor_to_numpy(msg) -> np.ndarray:
    from tinker.proto.response_conv import _tensor_data_from_proto

    size = int(np.prod([int(d) for d in msg.shape], dtype=object)) if msg.shape else 0
    if size > MAX_TENSOR_ELEMENTS or any(int(d) < 0 for d in msg.shape):
        raise ValueError(f"shape {list(msg.shape)} is over {MAX_TENSOR_ELEMENTS} elements")
    arr = _tensor_data_from_proto(msg).to_numpy(pad_value=0)
    return arr if arr.ndim == 2 else arr.reshape(-1)  # [N, K]: soft targets (cross_entropy)


def _chunk_tokens(chunk, where: str) -> list[int]:
    kind = chunk.WhichOneof("chunk")
    if kind not in (None, "encoded_text"):
        raise WireError(f"{where}: {kind} chunks are not supported by this server (text only)")
    raw = chunk.encoded_text.tokens
    if len(raw) % 4:
        raise WireError(f"{where}: encoded_text tokens are {len(raw)} bytes, not int32s")
    ids = np.frombuffer(raw, dtype=np.int32)
    if (ids < 0).any():
        raise WireError(f"{where}: negative token ids")
    return ids.astype(np.int64).tolist()


def decode_forward_backward(body: bytes, max_tokens: int | None = None) -> ForwardBackwardCall:
    """Parse a forward/backward request (zstd already undone); ``max_tokens``: the most
    tokens one datum may have."""
    msg = _pb().ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise WireError(f"forward_backward: the body is not a ForwardBackwardRequest ({e})") from e
    config: dict = {}
    for key, value in msg.loss_fn_config_v2.items():
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    for key, value in msg.loss_fn_config.items():
        config.setdefault(key, value)
    datums = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            tokens += _chunk_tokens(chunk, f"datum {i}")
        if max_tokens is not None and len(tokens) > max_tokens:
            raise WireError(
                f"datum {i} has {len(tokens)} tokens, over the base model's "
                f"max_context_length of {max_tokens}"
            )
        inputs = {}
        for name, t in d.loss_fn_inputs.items():
            try:
                inputs[name] = _tensor_to_numpy(t)
            except Exception as e:  # noqa: BLE001 - a malformed tensor is the caller's error
                raise WireError(
                    f"datum {i}: loss_fn_inputs[{name!r}] is not a valid "
                    f"tensor ({type(e).__name__}: {e})"
                ) from None
        datums.append({"tokens": tokens, "inputs": inputs})
    return ForwardBackwardCall(
        msg.model_id, int(msg.seq_id), msg.loss_fn, config, bool(msg.forward_only), datums
    )


def encode_forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict) -> bytes:
    """One ``ArrayRecord`` with a batched float32 ``logprobs`` field (per-datum offsets; an
    ``[N, K]`` output, for soft targets, also gives its ``trailing_shape`` ``[K]``)."""
    pb = _pb()
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    record = out.loss_fn_outputs.add()
    record.type_tag = "ArrayRecord"
    record.num_datums = len(outputs)
    names = sorted({name for o in outputs for name in o})
    for name in names:
        shaped = [np.asarray(o[name], dtype=np.float32) for o in outputs]
        arrays = [a.reshape(-1) for a in shaped]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        field = record.fields[name]
        if shaped and shaped[0].ndim == 2:
            field.trailing_shape.append(shaped[0].shape[1])
        field.dtype = pb.DTYPE_FLOAT32
        field.data = b"".join(a.tobytes() for a in arrays)
        field.offsets = offsets.tobytes()
    return out.SerializeToString()


TOPK_EMPTY_LOGPROB = -99999.0  # the SDK's mark of a top-k cell with nothing in it


def encode_sample_response(
    sequences: list[tuple[list[int], list[float] | None, str]],
    prompt_logprobs: list[float] | None = None,
    prompt_topk: tuple[list[list[int]], list[list[float]]] | None = None,
    k: int = 0,
) -> bytes:
    """``sequences``: (tokens, logprobs or None, stop reason ``"stop"`` | ``"length"``);
    ``prompt_logprobs``: one per prompt token (NaN where none), if asked for;
    ``prompt_topk``: (token ids, logprobs), ``k`` of each per prompt token after the first
    (the first has no context: sent as an empty row, which the SDK reads as ``None``)."""
    pb = _pb()
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    out = pb.SampleResponse()
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    if prompt_topk is not None:
        ids, lps = (np.asarray(a) for a in prompt_topk)
        ids_nk = np.concatenate([np.zeros((1, k), np.int32), ids.reshape(-1, k).astype(np.int32)])
        first = np.full((1, k), TOPK_EMPTY_LOGPROB, np.float32)
        lps_nk = np.concatenate([first, lps.reshape(-1, k).astype(np.float32)])
        out.topk_prompt_logprobs.length = ids_nk.shape[0]
        out.topk_prompt_logprobs.k = k
        out.topk_prompt_logprobs.token_ids = ids_nk.tobytes()
        out.topk_prompt_logprobs.logprobs = lps_nk.tobytes()
    for tokens, logprobs, reason in sequences:
        seq = out.sequences.add()
        seq.stop_reason = reasons[reason]
        seq.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        if logprobs is not None:
            seq.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
    return out.SerializeToString()


def prompt_tokens(model_input: Any, where: str, max_tokens: int | None = None) -> list[int]:
    """The token ids of a JSON ``ModelInput`` (``{"chunks": [{"type": "encoded_text",
    "tokens": [...]}, ...]}``): at least one, at most ``max_tokens``."""
    chunks = model_input.get("chunks", []) if isinstance(model_input, dict) else None
    if not isinstance(chunks, list):
        raise WireError(f"{where}: the prompt must be a ModelInput object with a list of chunks")
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict):
            raise WireError(f"{where}: prompt chunk {i} must be an object")
        kind = chunk.get("type", "encoded_text")
        if kind != "encoded_text":
            raise WireError(f"{where}: {kind} chunks are not supported by this server (text only)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(_token_id(t) for t in ids):
            raise WireError(f"{where}: prompt chunk {i}'s tokens must be a list of token ids")
        tokens += ids
    if not tokens:
        raise WireError(f"{where}: the prompt has no tokens")
    if max_tokens is not None and len(tokens) > max_tokens:
        raise WireError(
            f"{where}: the prompt has {len(tokens)} tokens, over the base model's "
            f"max_context_length of {max_tokens}"
        )
    return tokens


def _token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31


def check_token_ids(ids: Any, vocab_size: int, where: str, model: str) -> None:
    """Every id of ``ids`` an integer in ``0..vocab_size - 1``, or a ``WireError`` naming the
    first one outside and its position. Checked per request, before it joins a batch: an id
    past the embedding fails the whole batch it is in (on a GPU, a device-side assert that
    takes the process down), so every request batched with it would fail too."""
    arr = np.asarray(ids, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(~((arr >= 0) & (arr < vocab_size) & (arr == np.floor(arr))))
    if bad.size:
        i = int(bad[0])
        value = arr[i]
        shown = int(value) if np.isfinite(value) and value == np.floor(value) else float(value)
        raise WireError(
            f"{where}: token id {shown} at position {i} is outside the vocabulary of {model} "
            f"(ids 0..{vocab_size - 1})"
        )


def check_datum_tokens(datums: list[dict], vocab_size: int, model: str) -> None:
    """``check_token_ids`` on each datum's ``model_input`` and ``target_tokens``."""
    for i, d in enumerate(datums):
        check_token_ids(d["tokens"], vocab_size, f"datum {i}: model_input", model)
        if "target_tokens" in d["inputs"]:
            where = f"datum {i}: loss_fn_inputs['target_tokens']"
            check_token_ids(d["inputs"]["target_tokens"], vocab_size, where, model)
