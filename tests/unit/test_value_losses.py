"""GAE over tokens, reward placement and the clipped value loss, against hand-computed numbers."""

from __future__ import annotations

import pytest
import torch

from forge.losses.value import (
    clipped_value_loss,
    explained_variance,
    gae_advantages,
    ppo_advantages_for_batch,
    token_rewards_bt,
    turn_rewards_bt,
    whiten,
)
from forge.types import TrainBatch


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_token_rewards_go_on_the_last_counted_token():
    mask_bt = _t([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1]])
    out = token_rewards_bt(torch.tensor([1.0, -1.0, 5.0, 2.0]), mask_bt)
    # The empty row gets nothing; the multi-turn row gets its reward after the last turn.
    assert torch.equal(out, _t([[0, 0, 1, 0], [0, 0, 0, -1], [0, 0, 0, 0], [0, 0, 0, 2]]))
    with pytest.raises(ValueError, match="same B"):
        token_rewards_bt(torch.tensor([1.0]), mask_bt)


def test_turn_rewards_go_on_the_last_token_of_each_turn():
    mask_bt = _t([[0, 1, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1]])
    out = turn_rewards_bt([[0.5, 1.0], [-1.0]], mask_bt)
    assert torch.equal(out, _t([[0, 0, 0.5, 0, 1, 0], [0, 0, 0, 0, 0, -1]]))
    with pytest.raises(ValueError, match="row 0 has 2 turns .* but 1 rewards"):
        turn_rewards_bt([[1.0], [1.0]], mask_bt)


def test_gae_gamma_1_lam_1_is_reward_minus_value():
    mask_bt = _t([[0, 1, 1, 1, 0]])
    values_bt = _t([[9, 0.2, 0.5, 0.7, 9]])  # 9s are prompt/padding: ignored
    rewards_bt = token_rewards_bt(torch.tensor([1.0]), mask_bt)
    adv, ret = gae_advantages(rewards_bt, values_bt, mask_bt)
    torch.testing.assert_close(adv, _t([[0, 0.8, 0.5, 0.3, 0]]))
    torch.testing.assert_close(ret, _t([[0, 1, 1, 1, 0]]))


def test_gae_gamma_09_lam_08_skips_the_masked_gap_between_turns():
    # Counted tokens t0, t1 (turn 1, reward 0.5 at its end), then two environment tokens
    # (mask 0, values 9 that must not be used), then t4 (turn 2, final reward 1).
    # gamma = 0.9, gamma * lam = 0.72; the next state of t1 is t4, the gap is transparent:
    #   t4: delta = 1   + 0.9 * 0   - 0.2 =  0.8       A4 = 0.8
    #   t1: delta = 0.5 + 0.9 * 0.2 - 0.4 =  0.28      A1 = 0.28  + 0.72 * 0.8   = 0.856
    #   t0: delta = 0   + 0.9 * 0.4 - 0.5 = -0.14      A0 = -0.14 + 0.72 * 0.856 = 0.47632
    #   returns = A + V: 0.97632, 1.256, 1.0
    mask_bt = _t([[1, 1, 0, 0, 1]])
    values_bt = _t([[0.5, 0.4, 9, 9, 0.2]])
    rewards_bt = turn_rewards_bt([[0.5, 1.0]], mask_bt)
    adv, ret = gae_advantages(rewards_bt, values_bt, mask_bt, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, _t([[0.47632, 0.856, 0, 0, 0.8]]))
    torch.testing.assert_close(ret, _t([[0.97632, 1.256, 0, 0, 1.0]]))
    # The same three tokens with no gap give the same numbers.
    adv3, ret3 = gae_advantages(_t([[0, 0.5, 1]]), _t([[0.5, 0.4, 0.2]]), _t([[1, 1, 1]]), 0.9, 0.8)
    torch.testing.assert_close(adv3, adv[:, [0, 1, 4]])
    torch.testing.assert_close(ret3, ret[:, [0, 1, 4]])


def test_gae_batch_of_rows_with_different_lengths():
    mask_bt = _t([[0, 1, 1, 0], [1, 1, 1, 1]])
    values_bt = _t([[0, 0.1, 0.3, 0], [0.1, 0.2, 0.3, 0.4]])
    rewards_bt = token_rewards_bt(torch.tensor([1.0, -1.0]), mask_bt)
    adv, ret = gae_advantages(rewards_bt, values_bt, mask_bt)
    torch.testing.assert_close(adv, _t([[0, 0.9, 0.7, 0], [-1.1, -1.2, -1.3, -1.4]]))
    torch.testing.assert_close(ret, _t([[0, 1, 1, 0], [-1, -1, -1, -1]]))
    # lam = 0: one-step TD errors r + gamma * V_next - V, here with gamma = 0.5:
    #   row 0: t1: 0.5 * 0.3 - 0.1 = 0.05    t2: 1 + 0 - 0.3 = 0.7
    #   row 1: t0: 0.5 * 0.2 - 0.1 = 0       t1: 0.5 * 0.3 - 0.2 = -0.05
    #          t2: 0.5 * 0.4 - 0.3 = -0.1    t3: -1 + 0 - 0.4 = -1.4
    adv0, _ = gae_advantages(rewards_bt, values_bt, mask_bt, gamma=0.5, lam=0.0)
    torch.testing.assert_close(adv0, _t([[0, 0.05, 0.7, 0], [0, -0.05, -0.1, -1.4]]))


def test_gae_rejects_rewards_on_masked_positions_and_bad_shapes():
    mask_bt = _t([[0, 1, 1]])
    with pytest.raises(ValueError, match="nonzero at positions where mask_bt is 0"):
        gae_advantages(_t([[1, 0, 0]]), _t([[0, 0, 0]]), mask_bt)
    with pytest.raises(ValueError, match="values_bt has shape"):
        gae_advantages(_t([[0, 0, 1]]), _t([[0, 0]]), mask_bt)
    with pytest.raises(ValueError, match="gamma and lam"):
        gae_advantages(_t([[0, 0, 1]]), _t([[0, 0, 0]]), mask_bt, gamma=1.5)


def test_whiten_over_counted_tokens():
    out = whiten(_t([[1, 2, 3, 100]]), _t([[1, 1, 1, 0]]))
    s = (2 / 3) ** 0.5  # population std of 1, 2, 3
    torch.testing.assert_close(out, _t([[-1 / s, 0, 1 / s, 0]]))
    scaled = whiten(_t([[1, 2, 3, 100]]), _t([[1, 1, 1, 0]]), shift_mean=False)
    torch.testing.assert_close(scaled, _t([[1 / s, 2 / s, 3 / s, 0]]))


# Three counted tokens and a masked one (eps = 0.2):
#   t0: V=1.0 V_old=0.5 R=2: unclipped 1.00, clip(V)=0.7 -> 1.69   max 1.69 (clipped, no grad)
#   t1: V=0.4 V_old=0.5 R=0: unclipped 0.16, clip(V)=0.4 -> 0.16   max 0.16
#   t2: V=0.0 V_old=0.5 R=1: unclipped 1.00, clip(V)=0.3 -> 0.49   max 1.00
# token_mean loss = 0.5 * (1.69 + 0.16 + 1.00) / 3 = 0.475; grad wrt V_t = (V - R) / 3 where
# the unclipped term is used. Unclipped: 0.5 * (1 + 0.16 + 1) / 3 = 0.36.
_V = [1.0, 0.4, 0.0, 5.0]
_V_OLD = [0.5, 0.5, 0.5, 0.0]
_R = [2.0, 0.0, 1.0, -3.0]
_MASK = [1, 1, 1, 0]


def test_clipped_value_loss_by_hand():
    v = _t([_V]).requires_grad_()
    loss, m = clipped_value_loss(v, _t([_V_OLD]), _t([_R]), _t([_MASK]), clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.475)
    torch.testing.assert_close(v.grad, _t([[0, 0.4 / 3, -1 / 3, 0]]))
    assert m["value_loss"] == pytest.approx(0.475)
    assert m["value_clip_fraction"] == pytest.approx(1 / 3)
    assert m["value_mean"] == pytest.approx(1.4 / 3)
    assert m["return_mean"] == pytest.approx(1.0)
    # R = 2, 0, 1 (variance 2/3); R - V = 1, -0.4, 1 (variance 98/225): EV = 1 - 98/150
    assert m["explained_variance"] == pytest.approx(52 / 150)


def test_unclipped_value_loss_by_hand():
    v = _t([_V]).requires_grad_()
    loss, m = clipped_value_loss(v, _t([_V_OLD]), _t([_R]), _t([_MASK]), clip_eps=None)
    loss.backward()
    assert loss.item() == pytest.approx(0.36)
    torch.testing.assert_close(v.grad, _t([[-1 / 3, 0.4 / 3, -1 / 3, 0]]))
    assert m["value_clip_fraction"] == 0.0
    # seq_mean over one row equals token_mean
    seq, _ = clipped_value_loss(_t([_V]), _t([_V_OLD]), _t([_R]), _t([_MASK]), None, "seq_mean")
    assert seq.item() == pytest.approx(0.36)


def test_explained_variance_edges():
    mask = _t([[1, 1, 1]])
    assert explained_variance(_t([[1, 2, 3]]), _t([[1, 2, 3]]), mask) == pytest.approx(1.0)
    assert explained_variance(_t([[2, 2, 2]]), _t([[1, 2, 3]]), mask) == pytest.approx(0.0)
    assert explained_variance(_t([[0, 0, 0]]), _t([[1, 1, 1]]), mask) == 0.0  # no variance


def test_ppo_advantages_for_batch():
    # Row 0: prompt of 2, response of 2. Row 1: prompt of 1, response of 3.
    mask_bt = _t([[0, 0, 1, 1], [0, 1, 1, 1]])
    batch = TrainBatch(
        input_ids_bt=torch.ones(2, 4, dtype=torch.long),
        attention_mask_bt=torch.ones(2, 4, dtype=torch.long),
        response_mask_bt=mask_bt,
        behavior_logprobs_bt=torch.zeros(2, 4),
        advantages_b=torch.zeros(2),
    )
    values_bt = _t([[0, 0, 0.5, 0.25], [0, 0, 0.5, 1]])
    adv, ret = ppo_advantages_for_batch(batch, torch.tensor([1.0, 0.0]), values_bt)
    torch.testing.assert_close(adv, _t([[0, 0, 0.5, 0.75], [0, 0, -0.5, -1]]))
    torch.testing.assert_close(ret, _t([[0, 0, 1, 1], [0, 0, 0, 0]]))
    white, ret_w = ppo_advantages_for_batch(
        batch, torch.tensor([1.0, 0.0]), values_bt, whiten_advantages=True
    )
    torch.testing.assert_close(white, whiten(adv, mask_bt))
    torch.testing.assert_close(ret_w, ret)
