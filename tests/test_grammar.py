"""JSON-Schema constrained decoding (memagent/engines/json_schema.py, grammar.py) with a tiny random model.

A random model is the hardest case for a grammar: it has no idea of JSON, so every reply that
parses and validates does so because of the constraint. The model's embedding is padded past the
tokenizer (as real checkpoints often are) so the padded ids must be masked too.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from memagent.engines.grammar import make_constraint
from memagent.engines.json_schema import (
    DATE_PATTERN,
    MAX_ARRAY_ITEMS,
    MAX_MAGNITUDE,
    MAX_STRING_CHARS,
    NUMBER_STEP,
    render_schema,
)

PAD = 40  # embedding rows past the tokenizer's vocabulary

FIELDS = {
    "string": {"type": "string", "description": "the counterparty's name"},
    "number": {"type": "number", "description": "total amount payable"},
    "integer": {"type": "integer", "description": "term in months"},
    "boolean": {"type": "boolean", "description": "renews automatically"},
    "date": {"type": "string", "format": "date", "description": "effective date"},
    "enum": {"enum": ["USD", "EUR", "GBP"], "description": "currency"},
    "array": {"type": "array", "items": {"type": "string"}, "description": "signatories"},
}


def one_field(kind: str) -> dict:
    return {"type": "object", "properties": {"value": FIELDS[kind]}, "required": ["value"]}


ALL_FIELDS = {"type": "object", "properties": {k: v for k, v in FIELDS.items()},
              "required": ["string", "date", "number", "enum"]}  # the others may be left out


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def model(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer) + PAD, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@torch.no_grad()
def decode(model, tokenizer, schema: dict, *, sample: bool, seed: int = 0, max_tokens: int = 3000):
    """Greedy or sampled (temperature 1) decoding under the constraint; returns (text, token ids)."""
    constraint = make_constraint(json.dumps(schema), tokenizer, model.config.vocab_size)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Extract the fields as JSON."}],
                                           add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    gen = torch.Generator().manual_seed(seed)
    ids, past, out = torch.tensor([prompt]), None, []
    for _ in range(max_tokens):
        step = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = step.past_key_values
        logits = constraint.mask_logits(step.logits[0, -1].float().clone())
        if sample:
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        else:
            token = int(torch.argmax(logits))
        assert constraint.accept(token), f"the constraint refused the token it allowed: {token}"
        if token == tokenizer.eos_token_id:
            break
        out.append(token)
        if constraint.is_finished():
            break
        ids = torch.tensor([[token]])
    assert constraint.is_finished(), f"no complete value in {max_tokens} tokens: {tokenizer.decode(out)!r}"
    return tokenizer.decode(out), out


def check_reply(text: str, schema: dict) -> dict:
    value = json.loads(text)
    checker = jsonschema.FormatChecker()  # "date" is checked (datetime.date.fromisoformat)
    jsonschema.validate(value, schema, format_checker=checker)  # the user's schema (see render_schema)
    # Compact: no whitespace between the tokens of the JSON (only inside strings).
    assert not re.search(r"\s", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)), text
    return value


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", list(FIELDS))
def test_every_supported_type_decodes_to_valid_json(model, tokenizer, kind, sample):
    schema = one_field(kind)
    text, ids = decode(model, tokenizer, schema, sample=sample, seed=len(kind))
    value = check_reply(text, schema)["value"]
    assert max(ids) < len(tokenizer)  # never a padded embedding row
    if kind == "date":
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", value), value
    if kind == "string":
        assert len(value) <= MAX_STRING_CHARS
    if kind in ("number", "integer"):  # bounded, or a random model's digit loop never ends
        assert abs(value) <= MAX_MAGNITUDE and re.fullmatch(r"-?\d+(\.\d{1,6})?", text[9:-1]), text
    if kind == "array":
        assert len(value) <= MAX_ARRAY_ITEMS and all(len(v) <= MAX_STRING_CHARS for v in value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_many_field_schema_decodes_to_valid_json(model, tokenizer, seed):
    text, _ = decode(model, tokenizer, ALL_FIELDS, sample=True, seed=seed)
    value = check_reply(text, ALL_FIELDS)
    assert set(ALL_FIELDS["required"]) <= set(value) <= set(FIELDS)


def allowed(constraint, vocab_size: int) -> torch.Tensor:
    return torch.isfinite(constraint.mask_logits(torch.zeros(vocab_size)))


def test_padded_ids_are_masked_and_refused(tokenizer):
    vocab = len(tokenizer) + PAD
    c = make_constraint(json.dumps(one_field("integer")), tokenizer, vocab)
    logits = torch.zeros(vocab)
    logits[len(tokenizer):] = 1e9  # a random padded row that would win the argmax
    c.mask_logits(logits)
    assert torch.isinf(logits[len(tokenizer):]).all()
    assert int(torch.argmax(logits)) < len(tokenizer)
    assert not c.accept(len(tokenizer) + 3) and not c.accept(-1)
    with pytest.raises(ValueError, match="entries"):
        c.mask_logits(torch.zeros(len(tokenizer)))  # the width the constraint was built for


def test_accept_walks_a_reply_and_a_refused_token_changes_nothing(tokenizer):
    vocab = len(tokenizer) + PAD
    schema = json.dumps(ALL_FIELDS)
    # Keys come in the schema's order (the grammar's rule: a key out of order is refused).
    reply = '{"string":"Harlow Freight Ltd","number":48250.5,"date":"2021-03-14","enum":"GBP","array":["A. Smith"]}'
    tokens = tokenizer(reply, add_special_tokens=False)["input_ids"]
    c = make_constraint(schema, tokenizer, vocab)
    assert torch.equal(allowed(c, vocab), allowed(make_constraint(schema, tokenizer, vocab), vocab))
    # A refused token leaves the state as it was.
    before = allowed(c, vocab)
    assert not c.accept(tokenizer.convert_tokens_to_ids("hello"))
    assert torch.equal(allowed(c, vocab), before)
    for t in tokens:
        assert allowed(c, vocab)[t]
        assert not c.is_finished()
        assert c.accept(t)
    assert c.is_finished()


def test_is_finished_exactly_at_the_end_of_the_object(tokenizer):
    vocab = len(tokenizer)
    c = make_constraint(json.dumps(one_field("integer")), tokenizer, vocab)
    tokens = tokenizer('{"value":12}', add_special_tokens=False)["input_ids"]
    for t in tokens[:-1]:
        assert c.accept(t) and not c.is_finished()
    assert not c.accept(tokenizer.eos_token_id)  # EOS cannot end an unclosed object
    assert c.accept(tokens[-1]) and c.is_finished()
    assert torch.nonzero(allowed(c, vocab)).flatten().tolist() == [tokenizer.eos_token_id]
    assert c.accept(tokenizer.eos_token_id) and c.is_finished()


def feed(c, tokenizer, text: str) -> bool:
    return all(c.accept(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"])


def test_date_is_yyyy_mm_dd_and_nothing_else(tokenizer):
    schema = json.dumps(one_field("date"))
    assert feed(make_constraint(schema, tokenizer, len(tokenizer)), tokenizer, '{"value":"2021-03-14"}')
    for bad in ('{"value":"March', '{"value":"21-3-4', '{"value":"2021-13', '{"value":"2021-03-14T'):
        assert not feed(make_constraint(schema, tokenizer, len(tokenizer)), tokenizer, bad), bad


def test_no_whitespace_no_extra_keys(tokenizer):
    schema = json.dumps(one_field("integer"))
    for bad in ('{ "value"', '{"value": 1', '{"value":1 }', '{"other"'):
        assert not feed(make_constraint(schema, tokenizer, len(tokenizer)), tokenizer, bad), bad


def test_render_schema_bounds_values_and_leaves_its_input_alone():
    schema = {"type": "object", "properties": {
        "s": {"type": "string"}, "d": {"type": "string", "format": "date"},
        "e": {"type": "string", "enum": ["a", "b"]}, "own": {"type": "string", "maxLength": 9},
        "n": {"type": "number"}, "i": {"type": "integer", "minimum": 0},
        "a": {"type": "array", "items": {"type": "string"}}}}
    text = json.dumps(schema)
    out = render_schema(text)
    assert json.dumps(schema) == text  # not modified
    props = out["properties"]
    assert out["additionalProperties"] is False
    assert props["s"]["maxLength"] == MAX_STRING_CHARS and props["own"]["maxLength"] == 9
    assert props["d"]["pattern"] == DATE_PATTERN and "maxLength" not in props["d"]
    assert "maxLength" not in props["e"]
    assert (props["n"]["minimum"], props["n"]["maximum"], props["n"]["multipleOf"]) == (
        -MAX_MAGNITUDE, MAX_MAGNITUDE, NUMBER_STEP)
    assert (props["i"]["minimum"], props["i"]["maximum"]) == (0, MAX_MAGNITUDE) and "multipleOf" not in props["i"]
    assert props["a"]["maxItems"] == MAX_ARRAY_ITEMS and props["a"]["items"]["maxLength"] == MAX_STRING_CHARS
    assert render_schema(schema) == out
    for bad in ("[1, 2]", "{not json"):
        with pytest.raises(ValueError, match="json_schema"):
            render_schema(bad)


def test_bad_schemas_are_clear_errors(tokenizer):
    with pytest.raises(ValueError, match="JSON object"):
        make_constraint("[]", tokenizer, len(tokenizer))
    unknown = {"type": "object", "properties": {"x": {"type": "string", "format": "not-a-format"}}}
    with pytest.raises(ValueError, match="cannot be compiled"):
        make_constraint(json.dumps(unknown), tokenizer, len(tokenizer))


def test_constraints_of_one_schema_are_independent(tokenizer):
    schema = json.dumps(one_field("integer"))
    a, b = (make_constraint(schema, tokenizer, len(tokenizer)) for _ in range(2))
    assert feed(a, tokenizer, '{"value":1')
    assert not b.is_finished() and torch.equal(allowed(b, len(tokenizer)),
                                               allowed(make_constraint(schema, tokenizer, len(tokenizer)),
                                                       len(tokenizer)))


# -- record types: a per-chunk call returns a JSON array of records (memagent.extraction) ----------------

RECORDS = {"type": "object", "properties": {"payments": {
    "type": "array", "x-key": ["payer"], "items": {
        "type": "object", "required": ["payer", "date"],
        "properties": {**{k: v for k, v in FIELDS.items() if k != "string"}, "payer": FIELDS["string"],
                       "bank": {"type": "object", "properties": {"name": {"type": "string"},
                                                                 "code": {"type": "integer"}}}}}}}}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_records_schema_decodes_to_a_valid_array_of_records(model, tokenizer, seed):
    from memagent.extraction import ExtractionSchema

    schema = ExtractionSchema(RECORDS).records_schema("payments", max_items=3)
    text, ids = decode(model, tokenizer, schema, sample=seed > 0, seed=seed)
    value = check_reply(text, schema)
    assert isinstance(value, list) and len(value) <= 3 and max(ids, default=0) < len(tokenizer)
    for record in value:
        # Per chunk only the key is required (the rest of a record may be stated in other chunks).
        assert {"payer"} <= set(record) <= set(RECORDS["properties"]["payments"]["items"]["properties"])
        assert "date" not in record or re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"])


def test_the_records_grammar_takes_an_empty_array_and_refuses_other_shapes(tokenizer):
    from memagent.extraction import ExtractionSchema

    schema = json.dumps(ExtractionSchema(RECORDS).records_schema("payments", max_items=2))
    c = make_constraint(schema, tokenizer, len(tokenizer))
    assert feed(c, tokenizer, "[]") and c.is_finished()
    good = '[{"date":"2021-03-14","payer":"Ann"},{"date":"2021-03-15","payer":"Bo","bank":{"name":"NB"}}]'
    assert feed(make_constraint(schema, tokenizer, len(tokenizer)), tokenizer, good)
    assert feed(make_constraint(schema, tokenizer, len(tokenizer)), tokenizer, '[{"payer":"Ann"}]')  # key only
    for bad in ('{"payer"', '[{"date":"2021-03-14"}]', '[{"date":"2021-03-14","payer":"A","x"',
                '[{"date":"2021-03-14","payer":"A"},{"date":"2021-03-14","payer":"B"},{'):
        assert not feed(make_constraint(schema, tokenizer, len(tokenizer)), tokenizer, bad), bad
