"""Prompt templates as configuration: defaults, validation, TOML files, and their use by the agent."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from memagent.agent import check_config, read_document
from memagent.batch import answer_rows
from memagent.config import AgentConfig
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from memagent.full_context import read_full_context
from memagent.prompts import (
    ANSWER_INSTRUCTIONS,
    DEFAULT_PROMPTS,
    PromptTemplates,
    final_answer_messages,
    full_context_messages,
    load_prompts,
    memory_update_messages,
    prompts_to_toml,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "prompts"
CFG = AgentConfig(chunk_tokens=64, memory_tokens=8, answer_tokens=8, query_tokens=64)

# sha256 of the built-in templates and answer sentences (json.dumps, sorted keys) as they were when templates
# became configuration. Every job's prompts (and the prefixes engines cache) are these bytes: a change must
# be meant, and this pin updated with it.
_DEFAULTS_SHA256 = "6274b83ea87cdae0c38a5970f8ea2d67d80f3042888216ad759622cce071b039"
# How each style's answer sentence asks for its format (what the style's extraction reads back).
_STYLE_MARKERS = {"boxed": "\\boxed{}", "phrase": "the answer is", "json": "JSON"}

# The official MemAgent release's templates (recurrent/impls/memory.py, taskutils/memory_eval/utils/
# recurrent.py and openai_api.py), with {prompt} renamed {question}.
_PAPER_MEMORY = (
    "You are presented with a problem, a section of an article that may contain the answer to the problem, "
    "and a previous memory. Please read the provided section carefully and update the memory with the new "
    "information that helps to answer the problem. Be sure to retain all relevant details from the previous "
    "memory while adding any new, useful information.\n\n<problem> \n{question}\n</problem>\n\n<memory>\n{memory}\n"
    "</memory>\n\n<section>\n{chunk}\n</section>\n\nUpdated memory:\n"
)
_PAPER_FINAL = (
    "You are presented with a problem and a previous memory. Please answer the problem based on the previous "
    'memory and format your response as follows "Therefore, the answer is (insert answer here)".\n\n'
    "<problem> \n{question}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)
_PAPER_FINAL_BOXED = (
    "You are presented with a problem and a previous memory. Please answer the problem based on the previous "
    "memory and put the answer in \\boxed{{}}.\n\n"
    "<problem> \n{question}\n</problem>\n\n<memory>\n{memory}\n</memory>\n\nYour answer:\n"
)
_PAPER_FULL = (
    "Please read the following text and answer the question below.\n\n<text>\n{document}\n</text>\n\n{question}\n\n"
    'Format your response as follows: "Therefore, the answer is (insert answer here)".'
)

CUSTOM = PromptTemplates(
    memory_update="MEMO-TPL {instruction}Q={question} M={memory} C={chunk} keep \\boxed{{}} literal",
    final_answer="FINAL-TPL Q={question} M={memory} {answer_instruction}",
    full_context="FULL-TPL D={document} Q={question} {answer_instruction}",
)


class RecordingEngine(Engine):
    """Replies by script and keeps every prompt it was sent."""

    def __init__(self, tokenizer, reply, context_window: int = 4096):
        self.name, self.context_window, self.tokenizer = "scripted", context_window, tokenizer
        self.stats = EngineStats()
        self.reply, self.prompts = reply, []

    async def chat(self, messages, params: SamplingParams) -> Completion:
        self.prompts.append(messages[0]["content"])
        return Completion(text=self.reply(messages[0]["content"]), prompt_tokens=10, completion_tokens=3,
                          finish_reason="stop")


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prompts.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_default_prompt_text_is_pinned():
    """The built-in templates and answer sentences are byte for byte those pinned by their digest."""
    text = json.dumps([DEFAULT_PROMPTS.model_dump(), ANSWER_INSTRUCTIONS], sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest() == _DEFAULTS_SHA256


@pytest.mark.parametrize("instruction", [None, "List every code."])
@pytest.mark.parametrize("style", ["boxed", "phrase", "json"])
def test_defaults_render_each_value_once_verbatim_in_prefix_order(style, instruction):
    """A default prompt is its template with the values put in verbatim (braces literal), each once, the
    instruction line and question before the memory and chunk, and the answer sentence of the style last."""
    line = f"Task: {instruction}\n" if instruction else ""
    q, m, c, d = "What is the code? {not a field}", "MEM \\boxed{x}", "chunk {braces}", "DOC {text}"
    memory = memory_update_messages(q, m, c, instruction)[0]["content"]
    final = final_answer_messages(q, m, style, instruction)[0]["content"]
    full = full_context_messages(q, d, style, instruction)[0]["content"]
    assert memory == DEFAULT_PROMPTS.memory_update.format(instruction=line, question=q, memory=m, chunk=c)
    assert final == DEFAULT_PROMPTS.final_answer.format(
        instruction=line, question=q, memory=m, answer_instruction=ANSWER_INSTRUCTIONS[style])
    assert full == DEFAULT_PROMPTS.full_context.format(
        instruction=line, question=q, document=d, answer_instruction=ANSWER_INSTRUCTIONS[style])
    for content, values in ((memory, [line, q, m, c]), (final, [line, q, m]), (full, [line, d, q])):
        values = [v for v in values if v]
        assert [content.count(v) for v in values] == [1] * len(values)
        assert [content.index(v) for v in values] == sorted(content.index(v) for v in values)
        assert ("Task:" in content) == bool(instruction)
    for content in (final, full):
        sentence = content[content.index(q if content is full else m):]
        assert _STYLE_MARKERS[style] in sentence and content.endswith("\n\nYour answer:")
    assert AgentConfig().prompts == DEFAULT_PROMPTS == PromptTemplates()


def test_toml_round_trip_of_defaults_and_awkward_text(tmp_path):
    assert load_prompts(_write(tmp_path, prompts_to_toml())) == DEFAULT_PROMPTS
    awkward = PromptTemplates(
        memory_update='"""quotes""" \\ back\\slash \\boxed{{}}\ttab \r\n trailing  \n\n{question}{memory}{chunk} ünï 🙂 ',
        final_answer="\n{question}\n{memory}\x7f\x01",
        full_context="{document}{question}\"",
    )
    text = prompts_to_toml(awkward)
    assert "  \n" not in text  # trailing spaces are escaped, so editors cannot trim them
    assert load_prompts(_write(tmp_path, text)) == awkward


def test_paper_files_hold_the_official_templates():
    paper = load_prompts(DOCS / "memagent-paper.toml")
    assert (paper.memory_update, paper.final_answer, paper.full_context) == (_PAPER_MEMORY, _PAPER_FINAL, _PAPER_FULL)
    boxed = load_prompts(DOCS / "memagent-paper-boxed.toml")
    assert (boxed.memory_update, boxed.final_answer, boxed.full_context) == (
        _PAPER_MEMORY, _PAPER_FINAL_BOXED, DEFAULT_PROMPTS.full_context)
    content = final_answer_messages("Q", "M", "boxed", prompts=boxed)[0]["content"]
    assert "put the answer in \\boxed{}." in content and content.endswith("Your answer:\n")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"memory_update": "{question} {memory}"}, r"template 'memory_update' is missing the placeholder \{chunk\}"),
        ({"final_answer": "{question}"}, r"template 'final_answer' is missing the placeholder \{memory\}"),
        ({"full_context": "{question}"}, r"template 'full_context' is missing the placeholder \{document\}"),
        ({"memory_update": "{question}{memory}{chunk}{answer_instruction}"},
         r"template 'memory_update' has an unknown placeholder \{answer_instruction\}"),
        ({"final_answer": "{question}{memory}{chunk}"}, r"template 'final_answer' has an unknown placeholder \{chunk\}"),
        ({"final_answer": "{question}{memory} \\boxed{}"}, r"template 'final_answer' has a positional placeholder"),
        ({"final_answer": "{question}{memory} }"}, r"template 'final_answer' is malformed"),
        ({"final_answer": "{question!r}{memory}"}, r"format spec or conversion in \{question\}"),
    ],
)
def test_bad_placeholders_are_errors_naming_template_and_placeholder(fields, match):
    with pytest.raises(ValueError, match=match):
        PromptTemplates(**fields)


def test_unknown_template_field_is_rejected():
    with pytest.raises(ValueError, match="extra"):
        PromptTemplates(final_answers="{question}{memory}")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('memory_update = "{question}{memory}{chunk}"\nfinal_answer = "{question}{memory}"\nsystem = "x"\n',
         r"prompts\.toml: unknown key 'system'; the keys are memory_update, final_answer"),
        ('memory_update = "{question}{memory}{chunk}"\n', r"prompts\.toml: missing key 'final_answer'"),
        ('memory_update = "{question}{memory}"\nfinal_answer = "{question}{memory}"\n',
         r"prompts\.toml: template 'memory_update' is missing the placeholder \{chunk\}"),
        ('memory_update = "{question}{memory}{chunk}{doc}"\nfinal_answer = "{question}{memory}"\n',
         r"prompts\.toml: template 'memory_update' has an unknown placeholder \{doc\}"),
        ('memory_update = 3\nfinal_answer = "{question}{memory}"\n', r"memory_update must be a string, got int"),
        ('memory_update = "unterminated\n', r"prompts\.toml is not valid TOML"),
    ],
)
def test_prompts_file_errors_are_one_line_value_errors(tmp_path, text, match):
    with pytest.raises(ValueError, match=match) as info:
        load_prompts(_write(tmp_path, text))
    assert "\n" not in str(info.value)


def test_missing_prompts_file(tmp_path):
    with pytest.raises(ValueError, match="prompts file .*nope.toml not found"):
        load_prompts(tmp_path / "nope.toml")


def test_full_context_is_optional_in_a_file(tmp_path):
    p = load_prompts(_write(tmp_path, 'memory_update = "{question}{memory}{chunk}"\nfinal_answer = "{question}{memory}"\n'))
    assert p.full_context == DEFAULT_PROMPTS.full_context and p.final_answer == "{question}{memory}"


def test_read_document_uses_the_configured_templates(tokenizer):
    engine = RecordingEngine(tokenizer, lambda p: "mem 42" if p.startswith("MEMO-TPL") else "So the answer is 42.")
    cfg = CFG.with_overrides(prompts=CUSTOM, answer_style="phrase")
    r = asyncio.run(read_document(engine, "What is the code?", "The code is 42. " * 40, cfg))
    assert r.n_chunks >= 2 and len(engine.prompts) == r.n_chunks + 1
    first, *_, last = engine.prompts
    assert first.startswith("MEMO-TPL Q=What is the code? M=No previous memory C=The code is 42.")
    assert first.endswith("keep \\boxed{} literal")
    assert engine.prompts[1].startswith("MEMO-TPL Q=What is the code? M=mem 42 C=")
    assert last == 'FINAL-TPL Q=What is the code? M=mem 42 End your reply with "Therefore, the answer is (your answer)".'
    assert r.prediction == "42"


def test_full_context_baseline_uses_the_configured_template(tokenizer):
    engine = RecordingEngine(tokenizer, lambda p: "\\boxed{7}")
    cfg = CFG.with_overrides(prompts=CUSTOM, answer_style="boxed", answer_tokens=16)
    r = asyncio.run(read_full_context(engine, "Which code?", "The code is 7.", cfg, window=512))
    assert engine.prompts == ["FULL-TPL D=The code is 7. Q=Which code? Put your final answer inside \\boxed{}."]
    assert r.prediction == "7"


def test_templates_are_recorded_in_the_config_json_and_output_column(tokenizer):
    cfg = CFG.with_overrides(prompts=CUSTOM)
    dumped = json.loads(cfg.model_dump_json())
    assert dumped["prompts"] == CUSTOM.model_dump()  # the output's `config` column
    assert cfg.model_dump()["prompts"]["memory_update"] == CUSTOM.memory_update  # `ask --trace-out`
    assert AgentConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert cfg.with_overrides(chunk_tokens=80).prompts == CUSTOM
    assert json.loads(AgentConfig().model_dump_json())["prompts"] == DEFAULT_PROMPTS.model_dump()

    engine = RecordingEngine(tokenizer, lambda p: "mem" if p.startswith("MEMO-TPL") else "the answer is 42")
    rows = [{"id": "a", "question": "What is the code?", "context": "The code is 42.", "answers": ["42"]}]
    [record] = asyncio.run(answer_rows(engine, rows, cfg))
    assert record["error"] is None and json.loads(record["config"])["prompts"] == CUSTOM.model_dump()


def test_instruction_needs_a_placeholder_in_the_templates(tokenizer):
    paper = PromptTemplates(memory_update="{question}{memory}{chunk}", final_answer="{question}{memory}")
    cfg = CFG.with_overrides(prompts=paper, instruction="Extract the codes.")
    engine = RecordingEngine(tokenizer, lambda p: "x")
    with pytest.raises(ValueError, match=r"the memory_update template has no \{instruction\} placeholder"):
        check_config(engine, cfg)
    with pytest.raises(ValueError, match=r"the final_answer template has no \{instruction\}"):
        final_answer_messages("Q", "M", "phrase", "Extract the codes.", paper)
    content = memory_update_messages("Q", "M", "C", "Extract the codes.", CUSTOM)[0]["content"]
    assert content.startswith("MEMO-TPL Task: Extract the codes.\nQ=Q")


def test_check_config_counts_the_configured_templates(tokenizer):
    engine = RecordingEngine(tokenizer, lambda p: "x", context_window=2048)
    cfg = AgentConfig(chunk_tokens=1400, memory_tokens=128, answer_tokens=64, query_tokens=128)
    check_config(engine, cfg)  # the built-in templates fit
    padding = " filler" * 300
    long_memory = PromptTemplates(memory_update=padding + "{question}{memory}{chunk}")
    with pytest.raises(ValueError, match="do not fit the model's context window"):
        check_config(engine, cfg.with_overrides(prompts=long_memory))
    long_final = PromptTemplates(final_answer=padding * 6 + "{question}{memory}")
    with pytest.raises(ValueError, match="do not fit the model's context window"):
        check_config(engine, cfg.with_overrides(prompts=long_final))
