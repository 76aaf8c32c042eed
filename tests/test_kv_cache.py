"""The reserved KV cache holds exactly what transformers' DynamicCache holds, without per-step copies."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from memagent.engines.kv_cache import ReservedCache, ReservedLayer


def states(b: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, t, 4, generator=g), torch.randn(b, 2, t, 4, generator=g)


def test_updates_match_dynamic_layer_and_write_in_place():
    reserved, dynamic = ReservedCache(1, capacity=8), DynamicCache()
    for step, t in enumerate([5, 1, 1]):  # a prefill, then two decode steps
        k, v = states(3, t, step)
        rk, rv = reserved.update(k, v, 0)
        dk, dv = dynamic.update(k, v, 0)
        assert torch.equal(rk, dk) and torch.equal(rv, dv)
    layer = reserved.layers[0]
    assert isinstance(layer, ReservedLayer) and layer.capacity == 8 and reserved.get_seq_length() == 7
    assert layer.keys.data_ptr() == layer._k.data_ptr()  # a view of the buffer, not a copy


def test_outgrowing_the_reservation_and_reordering_keep_the_contents():
    cache = ReservedCache(1, capacity=4)
    k1, v1 = states(2, 3, 0)
    k2, v2 = states(2, 3, 1)
    cache.update(k1, v1, 0)
    keys, _ = cache.update(k2, v2, 0)  # 6 > 4: grows
    assert torch.equal(keys, torch.cat([k1, k2], dim=-2)) and cache.layers[0].capacity >= 6
    cache.batch_select_indices(torch.tensor([1]))  # beam-style reorder makes a new tensor
    k3, v3 = states(1, 1, 2)
    keys, values = cache.update(k3, v3, 0)
    assert torch.equal(keys, torch.cat([k1[1:], k2[1:], k3], dim=-2))
    assert torch.equal(values, torch.cat([v1[1:], v2[1:], v3], dim=-2))


def test_generate_with_a_reserved_cache_matches_the_default(tiny_llama_dir):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir)).eval()
    ids = torch.tensor([[0, 0, 11, 12, 13, 14], [21, 22, 23, 24, 25, 26]])
    mask = (ids != 0).long()
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=7, do_sample=False, pad_token_id=0,
                  return_dict_in_generate=True, output_logits=True)
    plain = model.generate(**kwargs)
    reserved = model.generate(**kwargs, cache=ReservedCache(model.config.num_hidden_layers, capacity=13))
    assert torch.equal(plain.sequences, reserved.sequences)
    assert torch.allclose(torch.stack(plain.logits), torch.stack(reserved.logits), atol=1e-5)
