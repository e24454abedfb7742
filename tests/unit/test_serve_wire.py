"""forge serve's protobuf bodies against the tinker SDK's own encoders and decoders."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tinker")

from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import (  # noqa: E402
    deserialize_forward_backward_output,
    deserialize_sample_response,
)

from forge.serve import wire  # noqa: E402
from forge.serve.app import sampling_kwargs  # noqa: E402
from forge.serve.futures import UserError  # noqa: E402


def _request(data, loss_fn="importance_sampling", config=None) -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=data, loss_fn=loss_fn, loss_fn_config=config
        ),
        model_id="model-1",
        seq_id=7,
    )
    msg = forward_backward_request_to_proto(req)
    msg.forward_only = True
    return msg.SerializeToString()


def test_a_forward_backward_request_decodes_to_datums():
    d = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": [2, 3, 4],
            "logprobs": [0.0, -1.5, -2.0],
            "advantages": [0.0, 1.0, 1.0],
        },
    )
    call = wire.decode_forward_backward(_request([d, d], "ppo", {"clip_low_threshold": 0.7}))
    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == (
        "model-1",
        7,
        "ppo",
        True,
    )
    assert call.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7)}
    assert len(call.datums) == 2 and call.datums[0]["tokens"] == [1, 2, 3]
    np.testing.assert_array_equal(call.datums[0]["inputs"]["target_tokens"], [2, 3, 4])
    np.testing.assert_allclose(call.datums[1]["inputs"]["logprobs"], [0.0, -1.5, -2.0])


def test_outputs_decode_with_the_sdk():
    outputs = [{"logprobs": np.array([-1.0, -2.0])}, {"logprobs": np.array([-0.5, -0.25, -3.0])}]
    body = wire.encode_forward_backward_output(outputs, {"loss:sum": 3.5})
    got = deserialize_forward_backward_output(body)
    assert got.metrics == {"loss:sum": 3.5}
    assert [o["logprobs"].tolist() for o in got.loss_fn_outputs] == [
        [-1.0, -2.0],
        [-0.5, -0.25, -3.0],
    ]

    sample = wire.encode_sample_response(
        [([5, 6, 7], [-0.5, -1.0, -2.0], "stop"), ([9], None, "length")]
    )
    seqs = deserialize_sample_response(sample).sequences
    assert seqs[0].tokens == [5, 6, 7] and seqs[0].stop_reason == "stop"
    assert seqs[0].logprobs == pytest.approx([-0.5, -1.0, -2.0])
    assert seqs[1].stop_reason == "length" and seqs[1].logprobs is None


def test_what_the_server_cannot_serve_is_named():
    with pytest.raises(wire.WireError, match="not a ForwardBackwardRequest"):
        wire.decode_forward_backward(b"\xff\xff\xff")
    with pytest.raises(wire.WireError, match="image chunks are not supported"):
        wire.prompt_tokens({"chunks": [{"type": "image", "data": ""}]}, "asample")
    with pytest.raises(UserError, match="sampling parameters \\['min_p'\\]"):
        sampling_kwargs({"min_p": 0.1}, 1, 16)
    with pytest.raises(UserError, match="stop=\\[\\]"):
        sampling_kwargs({"stop": []}, 1, 16)
    kw = sampling_kwargs({"max_tokens": None, "top_k": -1, "temperature": 0.5, "stop": "\n"}, 3, 16)
    assert kw == {
        "n": 3,
        "max_tokens": 16,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": 0,
        "seed": None,
        "stop": ["\n"],
    }


def test_soft_targets_and_their_outputs_keep_their_n_by_k_shape_through_the_sdk():
    t_nk = np.array([[2, 7], [3, 8], [4, 9]], dtype=np.int64)
    w_nk = np.array([[0.75, 0.25], [1.0, 0.0], [0.5, 0.5]], dtype=np.float32)
    d = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(t_nk),
            "weights": types.TensorData.from_numpy(w_nk),
        },
    )
    call = wire.decode_forward_backward(_request([d], "cross_entropy"))
    np.testing.assert_array_equal(call.datums[0]["inputs"]["target_tokens"], t_nk)
    np.testing.assert_array_equal(call.datums[0]["inputs"]["weights"], w_nk)
    lp = [np.full((3, 2), -1.0), np.arange(4.0).reshape(2, 2)]
    out = deserialize_forward_backward_output(
        wire.encode_forward_backward_output([{"logprobs": a} for a in lp], {})
    )
    for got, want in zip(out.loss_fn_outputs, lp):
        assert got["logprobs"].shape == [len(want), 2]
        np.testing.assert_array_equal(got["logprobs"].to_numpy(), want)


def test_topk_prompt_logprobs_decode_with_the_sdk_and_the_first_position_has_none():
    ids = [[7, 3], [4, 9], [1, 2]]
    lps = [[-0.5, -1.5], [-0.1, -3.0], [-2.0, -2.5]]
    body = wire.encode_sample_response(
        [([5], [-0.3], "length")], [float("nan"), -1.0, -0.2, -2.0], (ids, lps), k=2
    )
    out = deserialize_sample_response(body)
    assert out.topk_prompt_logprobs[0] is None
    assert out.topk_prompt_logprobs[1:] == [
        [(t, pytest.approx(lp)) for t, lp in zip(r_ids, r_lps)] for r_ids, r_lps in zip(ids, lps)
    ]
    one_token = deserialize_sample_response(
        wire.encode_sample_response([([5], None, "stop")], None, ([], []), k=4)
    )
    assert one_token.topk_prompt_logprobs == [None]
