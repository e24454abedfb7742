"""Fuzz ``forge serve``'s request parsing (the FastAPI app in this process, no actors): any
body on any route is answered 2xx, 400, 404 or 413, never a 500 or a hang, and nothing is
spawned for a request that does not name a real session. Bounded: see ``FUZZ``."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("tinker")

from fastapi.testclient import TestClient  # noqa: E402

from forge.serve.app import build_app  # noqa: E402
from forge.serve.serve_config import ServeConfig, toy_models  # noqa: E402
from forge.serve.state import ServerState  # noqa: E402

KEY = "tml-fuzz-key-0123456789abcdefgh"
FUZZ = settings(
    max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
ROUTES = [
    "create_session",
    "session_heartbeat",
    "create_model",
    "get_info",
    "forward_backward",
    "optim_step",
    "save_weights_for_sampler",
    "save_weights",
    "load_weights",
    "create_sampling_session",
    "asample",
    "retrieve_future",
    "telemetry",
]
FIELDS = [
    "session_id",
    "model_id",
    "model_seq_id",
    "base_model",
    "lora_config",
    "path",
    "optimizer",
    "overwrite",
    "seq_id",
    "adam_params",
    "optimizer_config",
    "prompt",
    "num_samples",
    "sampling_params",
    "sampling_session_id",
    "model_path",
    "request_id",
    "sampling_session_seq_id",
    "prompt_logprobs",
    "max_tokens",
    "stop",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "chunks",
    "tokens",
    "type",
    "learning_rate",
    "rank",
]
OK = {200, 400, 404, 413}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=40)
    | st.sampled_from(
        [
            "tinker://../weights/x",
            "forge/tiny/../..",
            "0/../../../../tmp/x",
            "tinker://a/weights/../../x",
            "session-0",
            "",
            "..",
            "\x00",
            "forge/tiny",
            "tinker://x:train:0/sampler_weights/s",
        ]
    )
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=20,
)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cfg = ServeConfig(
        models=toy_models(),
        dir=str(tmp_path_factory.mktemp("serve")),
        max_body_bytes=1 << 16,
        max_decompressed_bytes=1 << 18,
    )
    state = ServerState(cfg)
    with TestClient(build_app(state, KEY)) as client:
        # One real session: fuzzed bodies can name it (and still must spawn nothing they
        # cannot: only the exact fields of a valid create_model would).
        sid = client.post("/api/v1/create_session", json={}, headers={"X-API-Key": KEY})
        yield client, state, sid.json()["session_id"]
    assert not state.models and not state.base_generators, "a fuzzed request spawned actors"


def _post(client, route: str, content: bytes, **headers) -> int:
    t0 = time.monotonic()
    r = client.post(f"/api/v1/{route}", content=content, headers={"X-API-Key": KEY, **headers})
    assert time.monotonic() - t0 < 5, f"{route} took {time.monotonic() - t0:.1f} s"
    assert r.status_code in OK, (route, content[:200], r.status_code, r.text[:300])
    if r.status_code in (400, 413):
        assert r.json()["detail"], "an error without a reason"
    return r.status_code


@FUZZ
@given(route=st.sampled_from(ROUTES), body=bodies)
def test_json_bodies_never_give_500(served, route, body):
    client, state, _ = served
    if route in ("create_model", "create_sampling_session", "asample", "load_weights"):
        body.pop("session_id", None)  # fuzzed sessions are unknown: nothing gets spawned
        if route == "asample":
            body.pop("base_model", None)
    _post(client, route, json.dumps(body, allow_nan=True).encode())


@FUZZ
@given(route=st.sampled_from(ROUTES), raw=st.binary(max_size=300))
def test_raw_bytes_never_give_500(served, route, raw):
    client, _, _ = served
    _post(client, route, raw)


@FUZZ
@given(data=st.data())
def test_forward_backward_protobufs_never_give_500(served, data):
    from tinker.proto import tinker_public_pb2 as pb

    client, _, _ = served
    msg = pb.ForwardBackwardRequest(
        model_id=data.draw(st.text(max_size=20)), seq_id=data.draw(st.integers(0, 2**31))
    )
    for _ in range(data.draw(st.integers(0, 3))):
        d = msg.data.add()
        chunk = d.model_input.add()
        chunk.encoded_text.tokens = data.draw(st.binary(max_size=64))
        t = d.loss_fn_inputs[data.draw(st.sampled_from(["target_tokens", "weights", "x"]))]
        t.dtype = data.draw(st.integers(0, 8))
        t.shape.extend(data.draw(st.lists(st.integers(0, 2**40), max_size=3)))
        t.dense = data.draw(st.binary(max_size=64))
    raw = msg.SerializeToString()
    cut = data.draw(st.integers(0, len(raw)))
    _post(client, "forward_backward", raw[:cut] if data.draw(st.booleans()) else raw)


def test_the_session_route_accepts_what_the_sdk_sends(served):
    client, state, sid = served
    assert _post(client, "session_heartbeat", json.dumps({"session_id": sid}).encode()) == 200
