"""SDPA for grouped-query attention with a mask, without copying the KV cache (CPU).

transformers' ``sdpa`` attention repeats every key/value head for its query heads (``repeat_kv``:
a copy of the whole cache, every layer, every forward) whenever a mask is passed with more than
one query token, because CUDA's fused kernels refuse GQA with a mask. The decode loop always
passes a mask (its rows' holes), so every verification forward of ``t > 1`` tokens copied the
cache, most of a 16-row verification's time on CPU (benchmarks/README.md, "Verification without
copies"). PyTorch's CPU kernel takes GQA with a mask
(``enable_gqa=True``) and returns the same bits as the repeated heads, so on CPU this calls it
directly; on other devices, for one query token (transformers packs the heads already) and for
anything else unusual, transformers' own ``sdpa`` runs unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "memagent_sdpa"


def sdpa_gqa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, position_bias: torch.Tensor | None = None,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention output ``[B, t, H, D]`` from ``query`` ``[B, H, t, D]`` and ``key``/``value`` ``[B, KV, n, D]``.

    ``attention_mask``: transformers' SDPA mask (``[B, 1, t, n]``, or None).
    """
    plain = (query.device.type == "cpu" and getattr(module, "num_key_value_groups", 1) > 1
             and attention_mask is not None and query.shape[2] > 1 and position_bias is None
             and kwargs.get("softcap") is None and not kwargs.get("output_attentions", False))
    if not plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, position_bias=position_bias, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, sdpa_gqa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_gqa_sdpa(model: torch.nn.Module) -> None:
    """Switch a model that runs transformers' ``sdpa`` to :func:`sdpa_gqa_attention` (others unchanged)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(NAME)
