"""GKD (teacher.signal: gkd): the top-k generalized JSD on hand-computed numbers (k = 2),
its properties (teacher = student: 0 and no gradient; beta 0 / 1 are the forward / reverse
KL over the top-k and the tail), the teacher's top-k from its one prefill, the batch layout
of the targets, and the trainer: a few pure-GKD steps on a tiny model lower its KL to a
teacher over the teacher's top-k."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.losses.gkd import generalized_jsd, topk_forward_kl, topk_reverse_kl
from forge.losses.normalize import masked_mean
from forge.replay import collate_episodes
from forge.training import TrainerConfig, TrainerCore
from forge.training.gkd_term import student_topk_logprobs
from forge.types import Episode, TeacherTopK

LN = math.log


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# The teacher's top-2 have probabilities 0.6 and 0.2, so T = [0.6, 0.2, tail 0.2]; the student
# gives the same two ids 0.3 each: S = [0.3, 0.3, tail 0.4].
TEACHER = _t([[[LN(0.6), LN(0.2)]]])
STUDENT = _t([[[LN(0.3), LN(0.3)]]])
ONE = torch.ones(1, 1)
FORWARD = 0.6 * LN(0.6 / 0.3) + 0.2 * LN(0.2 / 0.3) + 0.2 * LN(0.2 / 0.4)  # KL(T || S)
REVERSE = 0.3 * LN(0.3 / 0.6) + 0.3 * LN(0.3 / 0.2) + 0.4 * LN(0.4 / 0.2)  # KL(S || T)
M = [0.45, 0.25, 0.3]  # beta 0.5: M = (T + S) / 2
JSD = 0.5 * (0.6 * LN(0.6 / 0.45) + 0.2 * LN(0.2 / 0.25) + 0.2 * LN(0.2 / 0.3)) + 0.5 * (
    0.3 * LN(0.3 / 0.45) + 0.3 * LN(0.3 / 0.25) + 0.4 * LN(0.4 / 0.3)
)


@pytest.mark.parametrize(
    ("beta", "want", "decimal"),
    [(0.0, FORWARD, 0.196166), (1.0, REVERSE, 0.190954), (0.5, JSD, 0.047509)],
)
def test_the_divergence_by_hand_with_k_2(beta, want, decimal):
    got = generalized_jsd(STUDENT, TEACHER, ONE, beta)
    assert got.item() == pytest.approx(want, rel=1e-5)
    assert want == pytest.approx(decimal, abs=1e-6)


def test_masked_positions_and_padding_slots_add_nothing():
    teacher = _t([[[LN(0.6), LN(0.2), float("-inf")], [0.0, float("-inf"), float("-inf")]]])
    student = _t([[[LN(0.3), LN(0.3), LN(0.35)], [-1.0, -2.0, -3.0]]]).requires_grad_()
    out = generalized_jsd(student, teacher, _t([[1.0, 0.0]]), 0.5)
    assert out[0, 0].item() == pytest.approx(JSD, rel=1e-5)  # the padding slot's 0.35: tail
    assert out[0, 1].item() == 0.0
    out.sum().backward()
    assert student.grad[0, 0, 2].item() == 0.0 and student.grad[0, 1].eq(0).all()
    assert torch.isfinite(student.grad).all()


def test_a_beta_per_row_and_bad_betas():
    both = generalized_jsd(
        STUDENT.repeat(2, 1, 1), TEACHER.repeat(2, 1, 1), ONE.repeat(2, 1), _t([0.0, 1.0])
    )
    assert both[:, 0].tolist() == pytest.approx([FORWARD, REVERSE], rel=1e-5)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\]"):
        generalized_jsd(STUDENT, TEACHER, ONE, 1.5)
    with pytest.raises(ValueError, match="same"):
        generalized_jsd(STUDENT, TEACHER[..., :1], ONE, 0.5)


_LOGITS = st.lists(st.floats(-5.0, 5.0), min_size=6, max_size=6)


def _top4(logits) -> torch.Tensor:
    """Logprobs of the first 4 of 6 outcomes: a top-4 with a tail of the other 2."""
    return torch.log_softmax(_t([[logits]]), -1)[..., :4]


@settings(max_examples=40, deadline=None)
@given(
    teacher=_LOGITS,
    student=_LOGITS,
    beta=st.one_of(st.just(0.0), st.just(1.0), st.floats(1e-3, 1.0 - 1e-3)),
)
def test_properties_over_random_top_k(teacher, student, beta):
    t_btk = _top4(teacher)
    same = t_btk.clone().requires_grad_()
    zero = generalized_jsd(same, t_btk, ONE, beta)
    zero.sum().backward()
    assert abs(zero.item()) < 1e-6 and same.grad.abs().max().item() < 1e-6  # teacher = student
    s_btk = _top4(student)
    out = generalized_jsd(s_btk, t_btk, ONE, beta).item()
    assert out >= -1e-6
    fwd = topk_forward_kl(s_btk, t_btk, ONE).item()
    rev = topk_reverse_kl(s_btk, t_btk, ONE).item()
    assert generalized_jsd(s_btk, t_btk, ONE, 0.0).item() == pytest.approx(fwd, abs=1e-6)
    assert generalized_jsd(s_btk, t_btk, ONE, 1.0).item() == pytest.approx(rev, abs=1e-6)

    # Exact over the top-4 and the tail: KL(T || S) from the probabilities themselves, and no
    # more than the KL over all 6 outcomes.
    def coarse(logits):
        p = torch.softmax(_t(logits), -1)
        return torch.cat([p[:4], p[4:].sum(0, keepdim=True)])

    p, q = coarse(teacher), coarse(student)
    exact = float((p.double() * (p.double() / q.double()).log()).sum())
    # float32: rounding grows with the value, and the student's tail, 1 - (its top-k mass),
    # loses about eps32 absolutely, which the teacher's tail mass scales by 1 / q_tail.
    tol = 1e-5 * (1 + abs(exact)) + 4e-7 * float(p[4] / q[4])
    assert fwd == pytest.approx(exact, abs=tol)
    full_p, full_q = torch.softmax(_t(teacher), -1), torch.softmax(_t(student), -1)
    full = float((full_p * (full_p / full_q).log()).sum())
    assert fwd <= full + tol
    if 0.0 < beta < 1.0:  # KL(T || M) <= (1 - beta) KL(T || S), KL(S || M) <= beta KL(S || T)
        bound = beta * (1 - beta) * (fwd + rev)
        assert out <= bound + 1e-5 * (1 + abs(bound))


def _episode(i: int, prompt, response, topk=None) -> Episode:
    return Episode(
        f"e{i}", list(prompt), list(response), [0.0] * len(response), 0.0, 0, teacher_topk=topk
    )


def test_targets_are_laid_out_like_the_logprobs():
    a = TeacherTopK([[7, 8], [9, 10]], [[-0.1, -2.0], [-0.3, -1.5]], beta=0.5, coef=2.0)
    b = TeacherTopK([[11]], [[-0.2]], beta=1.0, coef=1.0)  # another teacher, k = 1
    batch = collate_episodes(
        [_episode(0, [1, 2], [3, 4], a), _episode(1, [1], [5], b), _episode(2, [1], [6])]
    )
    top = batch.teacher_topk
    assert top.ids_btk.shape == (3, 4, 2)
    assert top.ids_btk[0, 2:4].tolist() == [[7, 8], [9, 10]]  # response positions 2, 3
    assert top.logprobs_btk[0, 3].tolist() == pytest.approx([-0.3, -1.5])
    assert top.logprobs_btk[1, 1].tolist() == [pytest.approx(-0.2), float("-inf")]
    assert torch.isinf(top.logprobs_btk[2]).all()  # no targets: a coef-0 row
    assert top.beta_b.tolist() == [0.5, 1.0, 0.0] and top.coef_b.tolist() == [2.0, 1.0, 0.0]
    assert collate_episodes([_episode(0, [1], [2])]).teacher_topk is None
    with pytest.raises(ValueError, match="teacher top-k"):
        collate_episodes([_episode(0, [1], [2, 3], b)])


def test_the_teachers_top_k_comes_from_its_full_distribution(tiny_model):
    from forge.models import load_model
    from forge.training.teacher_policy import TeacherCore
    from forge.training.trainer_config import ReferenceConfig

    core = TeacherCore(ReferenceConfig(model=tiny_model, device="cpu", temperature=0.7))
    eps = [_episode(0, [5, 6], [10, 11, 12]), _episode(1, [5], [20])]
    plain, topped = core.score(eps), core.score(eps, top_k=3)
    assert topped[0].logprobs == pytest.approx(plain[0].logprobs, abs=1e-5)
    assert topped[0].entropy == pytest.approx(plain[0].entropy, abs=1e-5)
    model = load_model(tiny_model)
    ids = torch.tensor([[5, 6, 10, 11, 12]])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, 1:4] / 0.7, -1)
    want_lp, want_ids = logp.topk(3, -1)
    assert topped[0].topk_ids == want_ids.tolist()
    torch.testing.assert_close(_t(topped[0].topk_logprobs), want_lp, atol=1e-5, rtol=1e-5)
    assert len(topped[1].topk_ids) == 1 and plain[0].topk_ids is None
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        core.score(eps, top_k=10**6)


def test_student_logprobs_are_aligned_with_the_batch(tiny_model):
    from forge.models import load_model

    model = load_model(tiny_model)
    ids_bt = torch.tensor([[5, 6, 10, 11]])
    topk_btk = torch.tensor([[[0, 0], [3, 4], [5, 6], [7, 8]]])
    got = student_topk_logprobs(model, ids_bt, torch.ones_like(ids_bt), topk_btk, 2.0)
    logits = torch.log_softmax(model(input_ids=ids_bt).logits[0] / 2.0, -1)
    assert got[0, 0].eq(0).all()
    torch.testing.assert_close(got[0, 2], logits[1, [5, 6]], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunked", [True, False])
def test_one_forward_gives_the_token_and_top_k_logprobs_and_their_gradients(tiny_model, chunked):
    """The trainer's one forward for a GKD batch (the chunked head's pieces, or the model's own
    logits) gives what two separate full forwards give: the sampled tokens' logprobs, the
    top-k ids' logprobs, and the gradient of a loss over both; with left padding."""
    from forge.models import load_model
    from forge.models.logprobs import head_logprobs, token_and_topk_logprobs, token_logprobs

    model = load_model(tiny_model).float()
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids_bt = torch.randint(0, vocab, (3, 7), generator=gen)
    mask_bt = torch.ones_like(ids_bt)
    mask_bt[0, :2] = 0  # left padding
    topk_btk = torch.randint(0, vocab, (3, 7, 4), generator=gen)
    weights_bt, weights_btk = torch.randn(3, 7, generator=gen), torch.randn(3, 7, 4, generator=gen)

    def grads(lp_bt, s_btk):
        model.zero_grad()
        ((lp_bt * weights_bt).sum() + (s_btk * weights_btk).sum()).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    lp_bt, s_btk = token_and_topk_logprobs(model, ids_bt, mask_bt, topk_btk, 0.7, chunked)
    want_lp = token_logprobs(model, ids_bt, mask_bt, 0.7)
    want_s = student_plain(model, ids_bt, mask_bt, topk_btk, 0.7)
    torch.testing.assert_close(lp_bt, want_lp, atol=1e-5, rtol=1e-5)
    valid = mask_bt.bool()
    torch.testing.assert_close(s_btk[valid], want_s[valid], atol=1e-5, rtol=1e-5)
    want = grads(want_lp, want_s * valid.unsqueeze(-1))
    got = grads(lp_bt, s_btk * valid.unsqueeze(-1))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    # The head in pieces of one position at a time: the same [N, J] values.
    hidden_nd = torch.randn(5, model.config.hidden_size, generator=gen)
    ids_nj = torch.randint(0, vocab, (5, 3), generator=gen)
    head = model.get_output_embeddings()
    whole = head_logprobs(head, hidden_nd, ids_nj, 0.7)
    torch.testing.assert_close(head_logprobs(head, hidden_nd, ids_nj, 0.7, vocab), whole)


def student_plain(model, ids_bt, mask_bt, topk_btk, temperature):
    """The top-k logprobs from the model's own full forward, by hand."""
    from forge.models.logprobs import position_ids_from_mask

    logits = model(
        input_ids=ids_bt, attention_mask=mask_bt, position_ids=position_ids_from_mask(mask_bt)
    ).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / temperature, -1).gather(-1, topk_btk[:, 1:])
    return torch.nn.functional.pad(logp, (0, 0, 1, 0))


def _exact_topk_kl(student, teacher, ids_bt, k: int) -> float:
    """The mean over response positions of KL(teacher || student) over the teacher's top-k
    and the tail."""
    with torch.no_grad():
        t = torch.log_softmax(teacher(input_ids=ids_bt).logits[:, :-1], -1)
        s = torch.log_softmax(student(input_ids=ids_bt).logits[:, :-1], -1)
    t_lp, t_ids = t.topk(k, -1)
    mask = torch.zeros(ids_bt.shape[0], ids_bt.shape[1] - 1)
    mask[:, 2:] = 1.0
    return masked_mean(topk_forward_kl(s.gather(-1, t_ids), t_lp, mask), mask).item()


def test_a_few_pure_gkd_steps_lower_the_students_kl_to_the_teacher(tmp_path):
    """No reward (advantages 0, so the policy-gradient term is 0 and skip_zero_advantage
    would skip every row): only the GKD term moves the student toward the teacher."""
    from forge.models import load_model, make_tiny_model
    from forge.training.teacher_policy import TeacherCore
    from forge.training.trainer_config import ReferenceConfig

    student = str(make_tiny_model(tmp_path / "student", seed=0))
    teacher = str(make_tiny_model(tmp_path / "teacher", seed=1))
    core = TrainerCore(
        TrainerConfig(model=student, optimizer={"lr": 1e-2}, skip_zero_advantage=True, device="cpu")
    )
    gen = torch.Generator().manual_seed(0)
    eps = [
        _episode(i, [5, 6, 7], torch.randint(10, 200, (6,), generator=gen).tolist())
        for i in range(8)
    ]
    k = 8
    for ep, score in zip(
        eps, TeacherCore(ReferenceConfig(model=teacher, device="cpu")).score(eps, top_k=k)
    ):
        ep.teacher_topk = TeacherTopK(score.topk_ids, score.topk_logprobs, beta=0.0, coef=1.0)
    batch = collate_episodes(eps)
    ids_bt = batch.input_ids_bt
    teacher_model = load_model(teacher)
    before = _exact_topk_kl(core.model, teacher_model, ids_bt, k)
    metrics = [core.train_step(batch) for _ in range(5)]
    after = _exact_topk_kl(core.model, teacher_model, ids_bt, k)
    assert after < 0.7 * before, (before, after)
    # beta 0: the term is the forward KL measured above, at the weights before each step.
    assert metrics[0]["gkd_divergence"] == pytest.approx(before, rel=1e-3)
    assert metrics[0]["gkd_loss"] > metrics[-1]["gkd_loss"] > 0.0
    assert "rows_skipped" not in metrics[0] and metrics[0]["grad_norm"] > 0.0
