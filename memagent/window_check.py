"""The up-front check of a read's budgets against the model's window: every call's worst case must fit.

:func:`check_config` runs before any document is read (a job runs it before it starts an actor, with only
the engine's tokenizer and window: :mod:`memagent.engines.budget`), so budgets that cannot fit are one line
at once. An extraction's question is its field list, counted with the model's tokenizer; records calls of a
group of record types have their own request and reply budget (:mod:`memagent.extraction.record_groups`).
"""

from __future__ import annotations

from memagent.config import AgentConfig
from memagent.engines.base import Engine
from memagent.extraction.record_groups import group_reply_tokens
from memagent.extraction.schema import ExtractionSchema
from memagent.heads import labelled
from memagent.prompts import (
    PromptTemplates, final_answer_messages, memory_heads_messages, memory_update_messages, records_messages,
)


def template_overhead(engine: Engine, instruction: str | None = None, prompts: PromptTemplates | None = None) -> int:
    """Tokens of the memory-update prompt (``prompts``' template) with empty question, memory and chunk."""
    return engine.count_chat_tokens(memory_update_messages("", "", "", instruction, prompts))


def check_config(engine: Engine, config: AgentConfig) -> None:
    """Reject a config whose worst-case call does not fit ``engine``'s context window.

    Also rejects an ``instruction`` that the configured templates have no ``{instruction}`` for.
    """
    config.prompts.check_instruction(config.instruction)
    # The memory-update template bounds every call unless a custom final-answer one is longer.
    schema = config.extraction
    question = schema.memory_question(config.answer_tokens) if schema is not None else ""
    reply = group_tokens(config, engine, question) if schema is not None and schema.record_types else 0
    final = final_answer_messages("", "", config.answer_style, config.instruction, config.prompts,
                                  schema.answer_instruction() if schema else None)
    overhead = max(template_overhead(engine, config.instruction, config.prompts), engine.count_chat_tokens(final),
                   *(engine.count_chat_tokens(records_messages("", "", "", request, config.instruction, config.prompts))
                     for request in _records_requests(schema, reply)))
    if config.memory_heads > 1:  # the heads' template and labels (step numbers up to 6 digits) count as template
        k = config.memory_heads
        labels = labelled([""] * k, [999_999] * k)
        overhead = max(overhead, engine.count_chat_tokens(memory_heads_messages(
            "", labels, "", 0, k, config.instruction, config.prompts)))
    if schema is not None and schema.record_types:  # a split piece (half a chunk at most) reads two memories
        overhead += max(0, config.memory_tokens - config.chunk_tokens // 2)
        if any(len(g.names) > 1 for g in schema.record_groups(reply)):  # a group call's reply may be longer
            overhead += max(0, reply - max(config.memory_tokens, config.answer_tokens))
    if schema is None:
        config.check_fits(engine.context_window, overhead)
        return
    # The field list is every call's question, the only one an extraction asks: counted with the model's
    # tokenizer, it must fit query_tokens, and the window is checked with what it really takes.
    n = len(engine.tokenizer(question, add_special_tokens=False)["input_ids"])
    if n > config.query_tokens:
        raise ValueError(f"the extraction schema's field list is {n} tokens, over query_tokens={config.query_tokens}; "
                         f"raise query_tokens to {n} or more (or shorten the descriptions; its longest line: "
                         f"{_longest_line(engine, question)})")
    try:
        config.check_fits(engine.context_window, overhead, query_tokens=n)
    except ValueError as e:  # name what in the schema takes the most: the line to shorten
        raise ValueError(f"{e}; the field list's longest line: {_longest_line(engine, question)}") from None


def _longest_line(engine: Engine, text: str) -> str:
    """The line of ``text`` with the most tokens, as ``'line start…' (N tokens)``: the field or type to shorten."""
    n, line = max((len(engine.tokenizer(ln, add_special_tokens=False)["input_ids"]), ln) for ln in text.splitlines())
    return f"{line.strip()[:60]!r} ({n} tokens)"


def group_tokens(config: AgentConfig, engine: Engine, question: str) -> int:
    """The reply budget of a group records call (:func:`~memagent.extraction.record_groups.group_reply_tokens`)
    for the question every call asks."""
    n = len(engine.tokenizer(question, add_special_tokens=False)["input_ids"])
    return group_reply_tokens(config.memory_tokens, config.chunk_tokens, engine.context_window, n)


def _records_requests(schema: ExtractionSchema | None, reply_tokens: int) -> list[str]:
    """The requests a read's records calls can make: each group's, and each type's alone (an overflow)."""
    if schema is None or not schema.record_types:
        return []
    groups = [schema.group_records_instruction(g) for g in schema.record_groups(reply_tokens) if len(g.names) > 1]
    return groups + [schema.records_instruction(r.name) for r in schema.record_types]
