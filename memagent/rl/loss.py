"""Multi-Conv DAPO loss: clipped policy gradient, token-mean over every conversation, k3 KL.

All tensors are ``[B, T]`` rows of response tokens: one row per conversation (memory update
or final answer), right-padded, with ``mask`` 1 on response tokens (EOS included) and 0 on
padding (prompts never appear here: the caller slices them off). Per token t of row b::

    ratio  = exp(logp - old_logp)
    pg     = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))      # PPO / DAPO
    pg     = min(pg, -A * c)            if A < 0 and dual_clip c is set           # dual clip
    kl     = exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]             # k3, low variance
    loss   = sum_{b,t} mask * (pg + kl_coef * kl) / num_tokens                    # token-mean

``num_tokens`` defaults to ``mask.sum()``; with micro-batches the caller passes the token
count of the whole mini-batch, so the summed micro-batch losses equal the mini-batch's
token-mean. Token-mean (DAPO) gives every token the same weight, whatever the
length or the number of conversations it belongs to.
"""

from __future__ import annotations

import torch

__all__ = ["token_log_probs", "entropy_from_logits", "k3_kl", "masked_mean", "token_mean", "policy_loss"]


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each target token. ``logits [B, T, V]``, ``targets [B, T]`` -> ``[B, T]``.

    ``logits[:, t]`` must already be the prediction for ``targets[:, t]`` (shifted by the caller).
    """
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    # log_softmax then gather: one [B, T, V] temporary, fine at the micro-batch sizes used here.
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution. ``[B, T, V]`` -> ``[B, T]`` (nats)."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    """Low-variance (k3) estimate of KL(pi || ref) per token, ``[B, T]`` -> ``[B, T]``.

    ``k3 = exp(ref - logp) - (ref - logp) - 1`` >= 0; zero when the two agree. Clamped as verl's
    ``low_var_kl`` so one wild token cannot dominate. Example: logp=-1, ref=-2 ->
    exp(-1) + 1 - 1 = 0.3679.
    """
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    # expm1: exp(x) - 1 - x loses everything to cancellation in fp32 when |x| < ~1e-3.
    return (torch.expm1(log_ratio) - log_ratio).clamp(-clamp, clamp)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 when the mask is empty)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def policy_loss(
    *,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    num_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO's clipped, token-mean policy-gradient loss of one (micro-)batch of conversations (module docstring).

    Args:
        logp: ``[B, T]`` log-probs of the response tokens under the current policy (with grad).
        old_logp: ``[B, T]`` log-probs under the policy that sampled them (no grad).
        advantages: ``[B]`` one per conversation (broadcast over its tokens) or ``[B, T]``.
        mask: ``[B, T]`` 1 on response tokens that count, 0 on padding / masked conversations.
        clip_low, clip_high: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``
            (DAPO clip-higher: 0.2 / 0.28; the paper's scripts: 0.2 / 0.2).
        dual_clip: ``c`` > 1 bounding the loss of negative-advantage tokens at ``-A * c``; None: off.
        ref_logp: ``[B, T]`` reference-policy log-probs for the k3 KL term (None: no KL).
        kl_coef: weight of the KL term (paper: 0.001).
        entropy: ``[B, T]`` per-token entropy, only logged.
        num_tokens: the token-mean's denominator (default ``mask.sum()``).

    Returns:
        ``(loss, metrics)``: the scalar loss to back-propagate, and :func:`_loss_metrics`' floats.

    Example: one token, A = +1, ratio = 1.5, clip_high = 0.2 -> loss = -1.2 (clipped, no
    gradient); with A = -1 and ratio = 0.5, clip_low = 0.2 -> loss = max(0.5, 0.8) = 0.8.
    """
    _check(logp, old_logp, mask, dual_clip)
    mask, adv = mask.to(logp.dtype), _per_token(advantages, logp)  # [B, T]
    ratio = (logp - old_logp).clamp(-20.0, 20.0).exp()  # [B, T]; clamp keeps exp finite
    pg, clipped, dual_hit = clipped_pg(adv, ratio, clip_low, clip_high, dual_clip)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else None
    per_token = pg + kl_coef * kl if kl is not None and kl_coef else pg
    loss = token_mean(per_token, mask, num_tokens)
    with torch.no_grad():
        metrics = _loss_metrics(pg, adv, ratio, clipped, dual_hit, clip_low, clip_high, kl, logp, old_logp,
                                entropy, mask)
    return loss, metrics


def _per_token(advantages: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Advantages ``[B]`` (one per conversation) broadcast over its tokens to ``[B, T]``; ``[B, T]`` as they are."""
    adv = advantages.to(logp.dtype)
    return adv.unsqueeze(-1).expand_as(logp) if adv.ndim == 1 else adv


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, num_tokens: float | torch.Tensor | None = None
               ) -> torch.Tensor:
    """DAPO's token-level mean, ``[B, T]`` -> scalar: ``sum_{b,t} mask * per_token / num_tokens`` (default
    ``mask.sum()``). Every token weighs the same, whatever the length or the number of conversations it is in.
    """
    denom = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=per_token.dtype)
    return (per_token * mask).sum() / denom.clamp(min=1.0)


def _loss_metrics(pg: torch.Tensor, adv: torch.Tensor, ratio: torch.Tensor, clipped: torch.Tensor,
                  dual_hit: torch.Tensor, clip_low: float, clip_high: float, kl: torch.Tensor | None,
                  logp: torch.Tensor, old_logp: torch.Tensor, entropy: torch.Tensor | None,
                  mask: torch.Tensor) -> dict[str, float]:
    """The floats :func:`policy_loss` logs, averaged over the batch's masked tokens: ``pg_loss``, ``kl``,
    ``entropy``, ``clip_frac`` (tokens whose clipped branch was taken), ``clip_high_frac`` (A > 0, ratio >
    1 + clip_high), ``clip_low_frac`` (A < 0, ratio < 1 - clip_low), ``dual_clip_frac``, ``ratio``,
    ``approx_kl_old`` (k3 of old vs new) and ``tokens``."""
    return {"pg_loss": masked_mean(pg, mask).item(),
            **_clip_fractions(adv, ratio, clipped, dual_hit, mask, clip_low, clip_high),
            **_logged(logp, old_logp, ratio, kl, entropy, mask)}


def _clip_fractions(adv: torch.Tensor, ratio: torch.Tensor, clipped: torch.Tensor, dual_hit: torch.Tensor,
                    mask: torch.Tensor, clip_low: float, clip_high: float) -> dict[str, float]:
    """Shares of the masked tokens whose clipped branch was taken: any, above 1 + clip_high (A > 0), below
    1 - clip_low (A < 0), and at the dual clip's bound."""
    def share(hit: torch.Tensor) -> float:
        return masked_mean(hit.to(ratio.dtype), mask).item()

    return {"clip_frac": share(clipped), "clip_high_frac": share((adv > 0) & (ratio > 1.0 + clip_high)),
            "clip_low_frac": share((adv < 0) & (ratio < 1.0 - clip_low)), "dual_clip_frac": share(dual_hit)}


def _logged(logp: torch.Tensor, old_logp: torch.Tensor, ratio: torch.Tensor, kl: torch.Tensor | None,
            entropy: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    """The masked means logged beside the loss: ratio, k3 of old vs new, KL to the reference, entropy, tokens."""
    return {"ratio": masked_mean(ratio, mask).item(),
            "approx_kl_old": masked_mean(k3_kl(logp, old_logp), mask).item(),
            "kl": masked_mean(kl, mask).item() if kl is not None else 0.0,
            "entropy": masked_mean(entropy, mask).item() if entropy is not None else 0.0,
            "tokens": float(mask.sum().item())}


def _check(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, dual_clip: float | None) -> None:
    if not (logp.shape == old_logp.shape == mask.shape):
        raise ValueError(f"logp {tuple(logp.shape)}, old_logp {tuple(old_logp.shape)}, mask {tuple(mask.shape)} differ")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")


def clipped_pg(adv: torch.Tensor, ratio: torch.Tensor, clip_low: float, clip_high: float,
               dual_clip: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped policy-gradient loss (PPO / DAPO, then the dual clip), all ``[B, T]``.

    Returns ``(pg, clipped, dual_hit)``: the loss, where the clipped branch was taken, and where
    the dual clip bounded a negative-advantage token.
    """
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(loss_unclipped, loss_clipped)  # pessimistic bound
    dual_hit = torch.zeros_like(pg, dtype=torch.bool)
    if dual_clip is not None:
        bound = -adv * dual_clip  # caps how hard a very unlikely negative token is pushed down
        dual_hit = (adv < 0) & (pg > bound)
        pg = torch.where(adv < 0, torch.minimum(pg, bound), pg)
    return pg, loss_clipped > loss_unclipped, dual_hit
