"""GQA attention with a mask on CPU: the same logits as transformers' sdpa, without repeating the KV heads."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memagent.engines.gqa_attention import NAME, use_gqa_sdpa
from memagent.engines.kv_cache import ReservedCache


def gqa_llama(dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).to(dtype).eval()


def verify_logits(model: LlamaForCausalLM, rows: int = 3, context: int = 40, tokens: int = 5) -> torch.Tensor:
    """Logits ``[rows, tokens, V]`` of one decode-loop-shaped forward: a reserved cache, a 2-D mask with holes."""
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        cache = ReservedCache(model.config.num_hidden_layers, context + tokens + 8)
        prompt = torch.randint(0, 512, (rows, context), generator=g)
        mask = torch.ones((rows, context + tokens), dtype=torch.long)
        mask[0, :7] = 0  # left padding
        mask[1, 20:23] = 0  # a row's rejected draft slots
        model(input_ids=prompt, attention_mask=mask[:, :context], cache=cache, use_cache=True)
        pos = torch.arange(context, context + tokens).expand(rows, -1)
        step = torch.randint(0, 512, (rows, tokens), generator=g)
        return model(input_ids=step, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True).logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 2, 9])
def test_same_logits_as_transformers_sdpa(dtype, tokens):
    model = gqa_llama(dtype)
    assert model.config._attn_implementation == "sdpa"
    reference = verify_logits(model, tokens=tokens)
    use_gqa_sdpa(model)
    assert model.config._attn_implementation == NAME
    assert torch.equal(verify_logits(model, tokens=tokens), reference)


def test_same_gradients_for_training():
    """The trainer may train the rollout engine's own module (shared weights): its loss and gradients are unchanged."""
    def loss_and_grads(model):
        g = torch.Generator().manual_seed(3)
        ids = torch.randint(0, 512, (3, 30), generator=g)
        mask = torch.ones_like(ids)
        mask[0, :5] = 0
        model.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    model = gqa_llama().train()
    loss, grads = loss_and_grads(model)
    use_gqa_sdpa(model)
    loss_ours, grads_ours = loss_and_grads(model)
    assert torch.equal(loss, loss_ours) and all(torch.equal(a, b) for a, b in zip(grads, grads_ours))


def test_no_key_value_copies_with_a_mask(monkeypatch):
    """transformers' sdpa repeats the KV heads for a masked multi-token forward; this path never does."""
    import transformers.integrations.sdpa_attention as sdpa

    model = gqa_llama()
    use_gqa_sdpa(model)

    def refuse(*args, **kwargs):
        raise AssertionError("repeat_kv copied the cache")

    monkeypatch.setattr(sdpa, "repeat_kv", refuse)
    verify_logits(model, tokens=4)
    model.set_attn_implementation("sdpa")
    with pytest.raises(AssertionError, match="repeat_kv"):  # the copy this module avoids
        verify_logits(model, tokens=4)


def test_the_hf_engine_uses_it(tiny_llama_dir):
    from memagent.engines.config import EngineConfig
    from memagent.engines.hf import TransformersEngine

    engine = TransformersEngine(tiny_llama_dir, EngineConfig(model=str(tiny_llama_dir), dtype="fp32"))
    assert engine.model.config._attn_implementation == NAME


def test_the_cost_benchmark_measures_both_attentions_on_the_same_bits(tiny_llama_dir):
    from benchmarks.speculation import forward_cost
    from memagent.engines.config import EngineConfig
    from memagent.engines.hf import TransformersEngine

    engine = TransformersEngine(tiny_llama_dir, EngineConfig(model=str(tiny_llama_dir), dtype="fp32"))
    ours = forward_cost(engine, context_tokens=32, rows=(1, 3), tokens=(1, 4), repeats=1)
    theirs = forward_cost(engine, context_tokens=32, rows=(1, 3), tokens=(1, 4), repeats=1, attention="sdpa")
    assert (ours["attention"], theirs["attention"]) == (NAME, "sdpa")
    assert [r["logits_sha256"] for r in ours["table"]] == [r["logits_sha256"] for r in theirs["table"]]
    assert len({r["logits_sha256"] for r in ours["table"]}) == 4  # the digest sees the inputs
    assert engine.model.config._attn_implementation == NAME  # restored


def test_concurrency_benchmark_prices_each_forward_shape():
    from benchmarks.concurrency import forward_costs
    from memagent.engines.speculation import CostModel

    cost = CostModel(c0=0.01, c_row=0.001, c_tok=0.002)
    steps = [(0, 16, 16, 0.05), (0, 16, 16, 0.07), (2, 16, 12, 0.2), (8, 4, 4, 0.3)]  # (k, rows, active, s)
    out = forward_costs(steps, cost)
    assert out["decode_forward_s"] == 0.62
    assert [(r["rows"], r["tokens"], r["forwards"], r["mean_s"]) for r in out["forward_cost"]] == [
        (4, 9, 1, 0.3), (16, 1, 2, 0.06), (16, 3, 1, 0.2)]
    assert out["forward_cost"][1]["model_s"] == round(0.01 + 0.016 + 0.032, 4)
    assert set(out["observed_fit"]) == {"c0", "c_row", "c_tok"} and out["model_fit"]["c_tok"] == 0.002
    assert forward_costs(steps[:2], cost)["observed_fit"] is None  # one shape: nothing to fit
