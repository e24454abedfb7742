"""What the cookbook's distillation recipes ask of ``forge serve``, through the real ``tinker``
SDK on the toy model: top-k prompt logprobs (sdft's teacher), sampling clients of saved
checkpoints (train_on_policy's teacher), ``[N, K]`` soft targets for ``cross_entropy``
(sdft's loss), and clear 400s for a too-large k or an unknown checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tinker")
pytest.importorskip("peft")
pytest.importorskip("fastapi")

import tinker  # noqa: E402
from tinker import types  # noqa: E402

from tests.serve_process import TOY, serve_process  # noqa: E402

KEY = "tml-forge-distill-key-0123456789a"
SEQ = [5, 9, 13, 21, 30, 44, 7, 8]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A toy ``forge serve`` process, a service client and one training client (rank 4)
    trained one step, so its adapter is not zero."""
    work = tmp_path_factory.mktemp("serve")
    with serve_process(work, TOY + f"dir: {work / 'ckpt'}\nmax_prompt_topk: 8\n", KEY) as url:
        service = tinker.ServiceClient(base_url=url, api_key=KEY)
        tc = service.create_lora_training_client(base_model="forge/tiny", rank=4).result()
        _train(tc)
        yield service, tc
        service.close("success").result(timeout=30)


def _datum(tokens, **inputs):
    inputs.setdefault("target_tokens", tokens[1:])
    inputs.setdefault("weights", [1.0] * (len(tokens) - 1))
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def _train(tc, steps: int = 1) -> None:
    for _ in range(steps):
        tc.forward_backward([_datum(SEQ)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()


def _trainer_logprobs(tc) -> list[float]:
    """The trainer's (float32) logprobs of ``SEQ[1:]``."""
    out = tc.forward([_datum(SEQ)], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].tolist()


def _topk(sampler, k: int):
    return sampler.sample(
        types.ModelInput.from_ints(SEQ),
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
    ).result()


def test_topk_prompt_logprobs_are_a_float32_forwards_topk(served):
    """Each position's top k from the sampler equal the k most likely tokens of the
    trainer's float32 forward (read back as ``[N, K]`` cross_entropy targets)."""
    _, tc = served
    sampler = tc.save_weights_and_get_sampling_client().result()
    out = _topk(sampler, 5)
    top = out.topk_prompt_logprobs
    assert len(top) == len(SEQ) and top[0] is None
    assert all(len(row) == 5 for row in top[1:])
    ids_nk = np.array([[t for t, _ in row] for row in top[1:]])
    lp_nk = np.array([[lp for _, lp in row] for row in top[1:]])
    assert (np.diff(lp_nk, axis=1) <= 0).all()  # most likely first
    # The trainer scores the same [N, K] ids (position i predicts token i + 1).
    d = _datum(SEQ, target_tokens=ids_nk, weights=np.ones_like(lp_nk))
    trainer_nk = tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    assert trainer_nk.shape == [len(SEQ) - 1, 5]
    np.testing.assert_allclose(trainer_nk.to_numpy(), lp_nk, atol=1e-4)
    # Nothing outside the k is more likely: a prompt token among them has its logprob there,
    # one outside is no more likely than the k-th.
    for i, (row_ids, row_lp) in enumerate(zip(ids_nk, lp_nk)):
        actual, token = out.prompt_logprobs[i + 1], SEQ[i + 1]
        if token in row_ids:
            assert actual == pytest.approx(row_lp[list(row_ids).index(token)], abs=1e-5)
        else:
            assert actual <= row_lp[-1] + 1e-6


def test_a_saved_checkpoint_samples_its_own_weights_after_the_client_moves_on(served):
    """A sampler of ``save_state`` (``weights/``) or of a named ``save_weights_for_sampler``
    (``sampler_weights/``) path scores as the trainer did when it saved, not as the base
    model, and keeps doing so after the training client trains and saves again."""
    service, tc = served
    at_save = _trainer_logprobs(tc)
    state_path = tc.save_state("teacher").result().path
    sampler_path = tc.save_weights_for_sampler("teacher").result().path
    assert sampler_path.endswith("/sampler_weights/teacher")
    _train(tc, 2)
    tc.save_weights_and_get_sampling_client().result()  # the client's generator moves on
    assert _trainer_logprobs(tc) != pytest.approx(at_save, abs=1e-3)
    base = service.create_sampling_client(base_model="forge/tiny").result()
    base_lp = base.compute_logprobs(types.ModelInput.from_ints(SEQ)).result()[1:]
    assert base_lp != pytest.approx(at_save, abs=1e-3)
    for path in (state_path, sampler_path):
        teacher = service.create_sampling_client(model_path=path).result()
        scored = teacher.compute_logprobs(types.ModelInput.from_ints(SEQ)).result()
        assert scored[1:] == pytest.approx(at_save, abs=1e-4), path
        out = teacher.sample(
            types.ModelInput.from_ints(SEQ[:3]), 2, types.SamplingParams(max_tokens=3)
        ).result()
        assert len(out.sequences) == 2


def test_too_large_k_and_unknown_checkpoints_are_400s(served):
    service, tc = served
    sampler = tc.save_weights_and_get_sampling_client().result()
    with pytest.raises(tinker.BadRequestError, match=r"topk_prompt_logprobs=9 is over .* 8"):
        _topk(sampler, 9)
    model_id = tc.model_id
    for path, match in [
        (f"tinker://{model_id}/sampler_weights/nope", "no checkpoint"),
        (f"tinker://{model_id}/weights/nope", "no checkpoint"),
        (f"tinker://{model_id}/other/nope", "not a checkpoint kind"),
    ]:
        with pytest.raises(tinker.BadRequestError, match=match):
            service.create_sampling_client(model_path=path).result()
    with pytest.raises(tinker.BadRequestError, match="names where sampler weights go"):
        tc.save_state("sampler_weights").result()
