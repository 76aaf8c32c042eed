"""The full-context baseline: the same model reads the whole document in one prompt.

    answer = LLM(question, document[:head] + document[-tail:])    # one call, window-bounded

When the document does not fit the model's window, its middle is dropped (head and tail
halves kept, as RULER and the paper's long-context baselines do), so the baseline is compared
with the memory agent on identical items and its cost stays bounded. The result has the shape
of :class:`memagent.agent.Result` (no memory steps, one answer step) so batch jobs, scoring
and traces treat both methods alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memagent.agent import InputError, Result, Step, validate_inputs
from memagent.chunking import OffsetTokenizer, document_offsets
from memagent.config import AgentConfig
from memagent.engines.base import Engine, SamplingParams
from memagent.prompts import full_context_messages
from memagent.replies import extract_answer

SLACK_TOKENS = 16  # re-tokenising the kept text inside the prompt can shift a few tokens


@dataclass(frozen=True)
class TruncatedText:
    """What of a document fits: ``text`` is ``original[:head_end] + original[tail_start:]``."""

    text: str
    context_tokens: int
    kept_tokens: int
    head_end: int  # characters
    tail_start: int  # characters

    @property
    def truncated(self) -> bool:
        return self.kept_tokens < self.context_tokens


def truncate_middle(tokenizer: OffsetTokenizer, text: str, max_tokens: int) -> TruncatedText:
    """Keep the first ``ceil(max_tokens/2)`` and last ``floor(max_tokens/2)`` tokens of ``text``.

    Cuts fall on token boundaries of the original string (no decode round trip), so the kept
    text is a verbatim head and tail of the document.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    offsets = document_offsets(tokenizer, text)
    n = len(offsets)
    if n <= max_tokens:
        return TruncatedText(text, n, n, len(text), len(text))
    head = -(-max_tokens // 2)
    tail = max_tokens - head
    head_end = offsets[head][0]
    tail_start = offsets[n - tail][0] if tail else len(text)
    return TruncatedText(text[:head_end] + text[tail_start:], n, max_tokens, head_end, tail_start)


def document_budget(engine: Engine, question: str, config: AgentConfig, window: int | None = None) -> int:
    """Document tokens that fit one prompt: window - template - question - answer - slack."""
    window = window or engine.context_window
    overhead = engine.count_chat_tokens(
        full_context_messages(question, "", config.answer_style, config.instruction, config.prompts)
    )
    budget = window - overhead - config.answer_tokens - SLACK_TOKENS
    if budget <= 0:
        raise InputError(
            f"the full-context prompt leaves no room for the document: window {window}, prompt without "
            f"document {overhead}, answer {config.answer_tokens} tokens"
        )
    return budget


async def read_full_context(
    engine: Engine, question: str, context: str, config: AgentConfig, *, window: int | None = None
) -> Result:
    """Answer ``question`` from the whole ``context`` in one prompt (middle dropped if too long).

    Args:
        window: context window to fit (default: the engine's). Decoding and the answer format
            come from ``config`` so both methods are asked the same way; the prompt is
            ``config.prompts.full_context``.
    """
    question, context = validate_inputs(question, context)
    kept = truncate_middle(engine.tokenizer, context, document_budget(engine, question, config, window))
    t0 = time.perf_counter()
    messages = full_context_messages(question, kept.text, config.answer_style, config.instruction, config.prompts)
    params = SamplingParams(config.answer_tokens, config.temperature, config.top_p, call="answer")
    reply = await engine.chat(messages, params)
    step = Step(step=0, kind="answer", chunk_index=None, char_start=0, char_end=len(context), memory="",
                prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens,
                finish_reason=reply.finish_reason, seconds=round(time.perf_counter() - t0, 4))
    return Result(
        prediction=extract_answer(reply.text, config.answer_style, config.strict_extraction),
        response=reply.text,
        memory="",
        steps=[step],
        n_chunks=0,
        context_tokens=kept.context_tokens,
        truncated=kept.truncated,
    )
