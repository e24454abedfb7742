"""``forge serve`` checks every token id of a request against the base model's vocabulary
before the request joins a batch: an id past the embedding fails the whole batch it is in
(on a GPU a device-side assert), so one bad request would fail every request decoded with it.

The property: whichever requests carry an out-of-range id, in whichever field (prompt, stop
id, a datum's input or target) and position, each of them is answered 400 naming the id, and
every request sampled or trained alongside them succeeds. The generator and trainer here are
in-process fakes that fail a whole batch on a bad id, as the real ones do."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
pytest.importorskip("tinker")

from fastapi.testclient import TestClient  # noqa: E402
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402

from forge.serve.app import build_app  # noqa: E402
from forge.serve.serve_config import ServeConfig, toy_models  # noqa: E402
from forge.serve.state import ServedModel, ServerState  # noqa: E402
from forge.types import Completion  # noqa: E402

KEY = "tml-token-ids-key-0123456789abcdefgh"
H = {"X-API-Key": KEY}
BASE = "forge/tiny"
MODEL_ID = "session-0:train:0"
CASES = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


class _Route:
    def __init__(self, fn) -> None:
        self.route = self.call_one = fn


class BatchingGenerator:
    """Collects the prompts of concurrent requests and decodes them as one batch, which
    fails as a whole when any id is past the vocabulary (an index error in the embedding)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.pending: list[tuple[list[int], list, asyncio.Future]] = []
        self.generate = _Route(self._generate)

    async def _generate(self, prompt, n=1, stop=None, **_):
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((list(prompt), list(stop or ()), fut))
        return await fut

    async def flush(self) -> None:
        await asyncio.sleep(0.05)  # every submitted request has reached the batch by now
        batch, self.pending = self.pending, []
        ids = [
            t for prompt, stop, _ in batch for t in prompt + [s for s in stop if isinstance(s, int)]
        ]
        failed = any(t >= self.vocab for t in ids)
        for prompt, _, fut in batch:
            if failed:
                fut.set_exception(IndexError("index out of range in self (the batch's embedding)"))
            else:
                fut.set_result([Completion("", prompt, prompt[:1], [-0.5], "", "length", 0)])


class FakeTrainer:
    """Runs a forward_backward over its datums; an id past the vocabulary fails it."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.forward_backward_datums = _Route(self._fb)

    async def _fb(self, datums, loss_fn, config, forward_only):
        for d in datums:
            if max(d["tokens"]) >= self.vocab or d["inputs"]["target_tokens"].max() >= self.vocab:
                raise IndexError("index out of range in self")
        outputs = [{"logprobs": np.zeros(len(d["tokens"]))} for d in datums]
        return outputs, {"loss:sum": 0.0}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    state = ServerState(ServeConfig(models=toy_models(), dir=str(tmp_path_factory.mktemp("serve"))))
    vocab = state.vocab_size(BASE)
    generator = BatchingGenerator(vocab)
    state.base_generators[BASE] = generator
    base = state.cfg.base(BASE)
    state.models[MODEL_ID] = ServedModel(MODEL_ID, base, base.path, 4, FakeTrainer(vocab), None)
    stop = state.tokenizer(BASE).encode("a", add_special_tokens=False)[0]  # decodes to "a"
    with TestClient(build_app(state, KEY)) as client:
        yield client, generator, vocab, stop


def _retrieve(client, request_id: str):
    r = client.post("/api/v1/retrieve_future", json={"request_id": request_id}, headers=H)
    assert r.status_code == 200, r.text
    return r


def _requests(vocab: int):
    """A round of 2..5 requests; a non-empty subset of them carries one out-of-range id at a
    drawn position of a drawn field."""
    ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8)
    bad_id = st.integers(vocab, 2**31 - 1)
    return st.lists(
        st.tuples(ids, st.booleans(), bad_id, st.integers(0, 7), st.booleans()),
        min_size=2,
        max_size=5,
    ).filter(lambda rs: 0 < sum(r[1] for r in rs) < len(rs))


@CASES
@given(data=st.data())
def test_a_bad_sampling_request_gets_400_and_its_batch_mates_succeed(served, data):
    client, generator, vocab, stop_id = served
    futures, bad = [], []
    for prompt, is_bad, bad_id, pos, in_stop in data.draw(_requests(vocab)):
        prompt, stop = list(prompt), [stop_id, stop_id]
        if is_bad:
            target = stop if in_stop else prompt
            target[pos % len(target)] = bad_id
        body = {
            "base_model": BASE,
            "prompt": {"chunks": [{"tokens": prompt}]},
            "sampling_params": {"max_tokens": 1, "stop": stop},
        }
        r = client.post("/api/v1/asample", json=body, headers=H)
        if is_bad:
            bad.append((r, bad_id))
        else:
            assert r.status_code == 200, r.text
            futures.append(r.json()["request_id"])
    client.portal.call(generator.flush)
    for r, bad_id in bad:
        assert r.status_code == 400, r.text
        assert f"token id {bad_id} at position" in r.json()["detail"]
        assert "outside the vocabulary of forge/tiny" in r.json()["detail"]
    for request_id in futures:
        r = _retrieve(client, request_id)
        assert r.headers["content-type"] == "application/x-protobuf", r.text


def _forward_backward(tokens: list[int], targets: list[int]) -> bytes:
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": targets, "weights": [1.0] * len(tokens)},
    )
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id=MODEL_ID,
        seq_id=0,
    )
    return forward_backward_request_to_proto(req).SerializeToString()


@CASES
@given(data=st.data())
def test_a_bad_datum_gets_400_and_the_other_requests_succeed(served, data):
    client, _, vocab, _ = served
    futures = []
    for tokens, is_bad, bad_id, pos, in_target in data.draw(_requests(vocab)):
        tokens, targets = list(tokens), list(tokens[1:]) + [0]
        if is_bad:
            (targets if in_target else tokens)[pos % len(tokens)] = bad_id
        r = client.post(
            "/api/v1/forward_backward", content=_forward_backward(tokens, targets), headers=H
        )
        if is_bad:
            assert r.status_code == 400, r.text
            assert f"token id {bad_id} at position {pos % len(tokens)}" in r.json()["detail"]
        else:
            assert r.status_code == 200, r.text
            futures.append(r.json()["request_id"])
    for request_id in futures:
        r = _retrieve(client, request_id)
        assert r.headers["content-type"] == "application/x-protobuf", r.text


def test_the_vocabulary_is_the_models_own(served):
    from transformers import AutoConfig

    from forge.serve.serve_config import resolve_path

    client, _, vocab, _ = served
    assert (
        vocab
        == AutoConfig.from_pretrained(
            resolve_path(ServeConfig(models=toy_models()).base(BASE))
        ).vocab_size
    )
    body = {"base_model": BASE, "prompt": {"chunks": [{"tokens": [vocab - 1, vocab]}]}}
    r = client.post("/api/v1/asample", json=body, headers=H)
    assert r.status_code == 400 and f"ids 0..{vocab - 1}" in r.json()["detail"], r.text
    assert json.loads(r.text)["detail"].startswith("asample: prompt: token id")
