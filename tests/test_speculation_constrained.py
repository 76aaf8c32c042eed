"""Speculating rows and JSON-schema-constrained rows in the same batches, under concurrency (hf).

vLLM has an open report of n-gram speculation plus structured outputs failing under concurrent
requests (vllm-project/vllm #52620). Here many ``chat`` calls run at once on one engine, more than
fit in a batch, so batches mix constrained rows (llguidance, never drafting) with free rows that
draft by n-gram lookup or from the aligned prompt: every constrained reply must parse and validate
against its own schema, and every free greedy reply must equal the one of an engine that does not
speculate (fp32: the verify forward and the one-token forward agree).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import jsonschema
import pytest

from memagent.engines import EngineConfig, SamplingParams
from memagent.engines.hf import TransformersEngine

SCHEMAS = [
    {"type": "object", "properties": {"changed": {"type": "boolean"}}, "required": ["changed"],
     "additionalProperties": False},
    {"type": "object", "properties": {"party": {"type": "string", "maxLength": 12},
                                      "role": {"enum": ["buyer", "seller"]}},
     "required": ["party", "role"], "additionalProperties": False},
    {"enum": ["red", "green", "blue"]},
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
]
MEMORY = ("The contract was signed by Alice Martin on 3 May. The buyer is Northwind Ltd. "
          "The seller is Contoso. Delivery is due in June at the Leeds warehouse.")


def memory_update(i: int) -> list[dict[str, str]]:
    """A memory-update-shaped prompt: the previous memory, a chunk, and a reply that mostly copies."""
    chunk = f"Section {i}: the weather was mild and nothing else happened. " * (1 + i % 3)
    return [{"role": "user", "content": f"<memory>\n{MEMORY}\n</memory>\n<section>\n{chunk}\n</section>\n"
                                        f"Rewrite the memory with anything new:\n{MEMORY}\n{MEMORY}"}]


def requests(n: int) -> list[tuple[list[dict[str, str]], SamplingParams, dict | None]]:
    """``n`` requests, every third one constrained to one of SCHEMAS, the rest free greedy text."""
    out = []
    for i in range(n):
        if i % 3 == 1:
            schema = SCHEMAS[(i // 3) % len(SCHEMAS)]
            out.append(([{"role": "user", "content": f"Record {i} as JSON: {MEMORY}"}],
                        SamplingParams(max_tokens=48, json_schema=json.dumps(schema)), schema))
        else:
            out.append((memory_update(i), SamplingParams(max_tokens=24 + 4 * (i % 5)), None))
    return out


def engine(model_dir, **spec) -> TransformersEngine:
    # Batches of 4 for 15 requests: rows join and leave running batches, and compositions differ.
    return TransformersEngine.from_config(EngineConfig(model=str(model_dir), dtype="fp32", device="cpu",
                                                       max_batch_size=4, **spec), name="tiny-llama")


async def chat_all(eng: TransformersEngine, reqs) -> list:
    return await asyncio.gather(*(eng.chat(messages, params) for messages, params, _ in reqs))


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    reqs = requests(15)
    return reqs, asyncio.run(chat_all(engine(tiny_llama_dir, speculate=False), reqs))


def check_constrained(reqs, replies) -> None:
    for (_, _, schema), reply in zip(reqs, replies):
        if schema is not None:
            assert reply.finish_reason == "stop", reply.text
            jsonschema.validate(json.loads(reply.text), schema)
            assert reply.draft_tokens == 0  # constrained rows never draft


# adaptive=False drafts every proposal in full: the tiny random model rejects most aligned drafts
# (it does not copy), which the adaptive rule would soon stop drafting; in full, every path of the
# verification runs beside the constrained rows.
@pytest.mark.parametrize("draft_from, adaptive", [("ngram", False), ("both", False), ("both", True)])
def test_speculating_and_constrained_rows_share_batches_under_concurrency(tiny_llama_dir, reference, draft_from,
                                                                           adaptive):
    reqs, plain = reference
    check_constrained(reqs, plain)
    spec = engine(tiny_llama_dir, speculate=True, draft_from=draft_from, speculative_tokens=8, prompt_lookup_min=1)
    spec.speculation = replace(spec.speculation, adaptive=adaptive)
    replies = asyncio.run(chat_all(spec, reqs))
    check_constrained(reqs, replies)
    for (_, _, schema), want, got in zip(reqs, plain, replies):
        if schema is None:
            assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
    # The test must exercise what it claims: batches larger than one, rows that drafted and kept drafts.
    assert max(spec.stats.batch_sizes) > 1
    free = [r for (_, _, s), r in zip(reqs, replies) if s is None]
    # The model loops on "\n": n-gram drafts of the loop are accepted. (The aligned drafter finds
    # nothing to align on here: the reply's "\n\n" tokens never occur in the prompt; the packaged
    # model below copies its memory, and aligned drafts run there.)
    assert sum(r.draft_tokens for r in free) > 0 and sum(r.accepted_tokens for r in free) > 0


@pytest.mark.slow
def test_aligned_copies_and_constrained_rows_share_batches_on_the_packaged_model(smollm2_dir):
    from tests.test_speculation_aligned import MEMORY_TEXT, conversations

    eng = TransformersEngine.from_config(EngineConfig(model=str(smollm2_dir), dtype="fp32", device="cpu",
                                                      max_batch_size=4), name="smollm2-135m")
    reqs = [(m, SamplingParams(max_tokens=k), None) for m, k in conversations()]
    reqs += [([{"role": "user", "content": f"Record the door and its number as JSON: {MEMORY_TEXT}"}],
              SamplingParams(max_tokens=48, json_schema=json.dumps(schema)), schema) for schema in SCHEMAS[:3]]
    reqs = [reqs[i] for i in (0, 3, 1, 4, 2, 5)]  # constrained rows between the copies
    on = eng.speculation
    eng.speculation = replace(on, max_draft=0)
    plain = asyncio.run(chat_all(eng, reqs))
    for spec in (replace(on, ngram=False, adaptive=False), on):  # aligned drafts in full; the default
        eng.speculation = spec
        replies = asyncio.run(chat_all(eng, reqs))
        check_constrained(reqs, replies)
        for (_, _, schema), want, got in zip(reqs, plain, replies):
            if schema is None:
                assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason)
        copies = [r for (_, _, s), r in zip(reqs, replies) if s is None]
        assert sum(r.accepted_tokens for r in copies) > 0
        assert sum(r.decode_steps for r in copies) < sum(r.completion_tokens for r in copies) / 2
