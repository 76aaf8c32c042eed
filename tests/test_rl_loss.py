"""The clipped token-mean loss against hand-computed values. Run: .venv/bin/pytest tests/test_rl_loss.py"""

from __future__ import annotations

import math

import pytest
import torch

from memagent.rl.loss import entropy_from_logits, k3_kl, masked_mean, policy_loss, token_log_probs


def _loss(ratios, adv, mask=None, **kw):
    """Loss and d loss / d logp for rows of per-token ratios (old_logp = 0, logp = log ratio)."""
    logp = torch.log(torch.tensor(ratios, dtype=torch.float32)).requires_grad_(True)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask, dtype=torch.float32)
    loss, m = policy_loss(logp=logp, old_logp=torch.zeros_like(logp), advantages=torch.tensor(adv), mask=mask, **kw)
    loss.backward()
    return loss.item(), logp.grad, m


def test_on_policy_loss_is_minus_mean_advantage():
    loss, grad, m = _loss([[1.0, 1.0]], [2.0])
    assert loss == pytest.approx(-2.0)
    assert grad.flatten().tolist() == pytest.approx([-1.0, -1.0])  # -A * ratio / N tokens
    assert m["clip_frac"] == 0.0 and m["ratio"] == pytest.approx(1.0)


def test_clip_high_vs_clip_low_asymmetric():
    # A > 0: ratio 1.25 is inside [0.8, 1.28] -> keeps its gradient; clipped with symmetric 0.2.
    loss, grad, m = _loss([[1.25]], [1.0], clip_low=0.2, clip_high=0.28, dual_clip=None)
    assert loss == pytest.approx(-1.25) and grad.item() == pytest.approx(-1.25)
    assert m["clip_high_frac"] == 0.0
    loss, grad, m = _loss([[1.25]], [1.0], clip_low=0.2, clip_high=0.2, dual_clip=None)
    assert loss == pytest.approx(-1.2) and grad.item() == 0.0
    assert m["clip_high_frac"] == 1.0 and m["clip_frac"] == 1.0
    # A < 0: the low side is clip_low whatever clip_high is. ratio 0.75 -> max(0.75, 0.8) = 0.8, no grad.
    loss, grad, m = _loss([[0.75]], [-1.0], clip_low=0.2, clip_high=0.28, dual_clip=None)
    assert loss == pytest.approx(0.8) and grad.item() == 0.0
    assert m["clip_low_frac"] == 1.0 and m["clip_high_frac"] == 0.0
    # A < 0 and ratio 1.25: the pessimistic bound keeps the unclipped term (gradient flows).
    loss, grad, _ = _loss([[1.25]], [-1.0], clip_low=0.2, clip_high=0.2, dual_clip=None)
    assert loss == pytest.approx(1.25) and grad.item() == pytest.approx(1.25)


def test_dual_clip_bounds_negative_advantages():
    loss, grad, m = _loss([[5.0]], [-1.0], dual_clip=None)
    assert loss == pytest.approx(5.0)
    loss, grad, m = _loss([[5.0]], [-1.0], dual_clip=3.0)
    assert loss == pytest.approx(3.0) and grad.item() == 0.0 and m["dual_clip_frac"] == 1.0
    loss, _, m = _loss([[5.0]], [1.0], dual_clip=3.0)  # positive advantages are untouched
    assert loss == pytest.approx(-1.2) and m["dual_clip_frac"] == 0.0
    with pytest.raises(ValueError):
        _loss([[1.0]], [1.0], dual_clip=0.5)


def test_token_mean_over_conversations_of_different_lengths():
    # Conv 0: 3 tokens, A = +1; conv 1: 1 token (+2 padding), A = -1. Token-mean: (-3 + 1) / 4.
    loss, grad, m = _loss([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], [1.0, -1.0], mask=[[1, 1, 1], [0, 0, 1]])
    assert loss == pytest.approx(-0.5)  # a sequence-mean would give (-1 + 1) / 2 = 0
    assert m["tokens"] == 4.0
    assert grad.flatten().tolist() == pytest.approx([-0.25, -0.25, -0.25, 0.0, 0.0, 0.25])


def test_masks_exclude_padding_whatever_it_holds():
    logp = torch.tensor([[-1.0, -1.0, 30.0], [-2.0, -50.0, -50.0]])
    old = torch.tensor([[-1.0, -1.0, -90.0], [-2.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    kw = dict(advantages=torch.tensor([1.0, -1.0]), mask=mask, ref_logp=old.clone(), kl_coef=0.1)
    loss, m = policy_loss(logp=logp, old_logp=old, **kw)
    clean = torch.where(mask > 0, logp, old)  # padding made harmless
    loss_clean, m_clean = policy_loss(logp=clean, old_logp=old, **kw)
    assert loss.item() == pytest.approx(loss_clean.item()) == pytest.approx((-1 - 1 + 1) / 3)
    assert m["clip_frac"] == m_clean["clip_frac"] == 0.0


def test_micro_batches_sum_to_the_mini_batch_token_mean():
    torch.manual_seed(0)
    logp, old = torch.randn(4, 5) * 0.1 - 2, torch.randn(4, 5) * 0.1 - 2
    adv = torch.tensor([1.0, -0.5, 0.25, 2.0])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=torch.float32)
    whole, _ = policy_loss(logp=logp, old_logp=old, advantages=adv, mask=mask)
    n = mask.sum()
    parts = sum(policy_loss(logp=logp[s], old_logp=old[s], advantages=adv[s], mask=mask[s], num_tokens=n)[0]
                for s in (slice(0, 1), slice(1, 4)))
    assert parts.item() == pytest.approx(whole.item(), abs=1e-6)


def test_k3_kl_values_and_clamp():
    assert k3_kl(torch.tensor([-1.0]), torch.tensor([-2.0])).item() == pytest.approx(math.exp(-1))
    assert k3_kl(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    assert k3_kl(torch.tensor([-20.0]), torch.tensor([-1.0])).item() == 10.0  # exp(19) clamped
    # Tiny differences stay visible (x^2 / 2), not lost to fp32 cancellation.
    assert k3_kl(torch.tensor([0.0]), torch.tensor([1e-4])).item() == pytest.approx(5e-9, rel=1e-2)


def test_kl_term_adds_coef_times_mean_kl():
    logp = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    kw = dict(logp=logp, old_logp=logp.clone(), advantages=torch.tensor([0.0]), mask=torch.ones(1, 2))
    loss, m = policy_loss(ref_logp=ref, kl_coef=0.5, **kw)
    assert m["kl"] == pytest.approx(math.exp(-1) / 2)
    assert loss.item() == pytest.approx(0.5 * math.exp(-1) / 2)
    loss0, m0 = policy_loss(ref_logp=ref, kl_coef=0.0, **kw)  # logged, not trained
    assert loss0.item() == 0.0 and m0["kl"] == pytest.approx(m["kl"])


def test_token_log_probs_and_entropy():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e9, -1e9]]])  # [1, 2, 4]
    lp = token_log_probs(logits, torch.tensor([[2, 0]]))
    assert lp.flatten().tolist() == pytest.approx([math.log(0.25), math.log(0.75)])
    ent = entropy_from_logits(logits)
    assert ent[0, 0].item() == pytest.approx(math.log(4))
    assert ent[0, 1].item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), abs=1e-5)
    torch.testing.assert_close(token_log_probs(logits * 2, torch.tensor([[2, 0]]), temperature=2.0), lp)


def test_entropy_is_logged_as_masked_mean():
    _, _, m = _loss([[1.0, 1.0]], [1.0], mask=[[1, 0]], entropy=torch.tensor([[2.0, 100.0]]))
    assert m["entropy"] == 2.0
    assert masked_mean(torch.tensor([1.0]), torch.tensor([0.0])).item() == 0.0
