"""The two conversations of MemAgent and the extraction of answers from their replies.

Memory update (one per chunk): instruction, question, previous memory, section -> new memory.
Final answer (once): instruction, question, memory -> answer, in one of three styles.
Static text comes first and the changing parts last, so an engine with prefix caching reuses
the instruction and question across a document's calls (spec §1.3).
"""

from __future__ import annotations

import json
import re
from typing import Any

from memagent.config import AnswerStyle

NO_MEMORY = "No previous memory"

Messages = list[dict[str, str]]

MEMORY_UPDATE_TEMPLATE = """You are reading a long document one section at a time, with a question to answer at the end.
You keep a short memory of everything in the document that could help answer the question.
Below are the question, your memory so far, and the next section of the document.
Rewrite the memory: keep every relevant detail it already holds, and add any new facts from this section that help answer the question.
Write only the updated memory.
{instruction}
<problem>
{question}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:"""

_FINAL_HEAD = """You have read a long document and kept a memory of what matters for the question.
Answer the question using only the memory below.
{instruction}
<problem>
{question}
</problem>

<memory>
{memory}
</memory>

"""

_ANSWER_ENDINGS: dict[str, str] = {
    "boxed": "Put your final answer inside \\boxed{{}}.\n\nYour answer:",
    "phrase": 'End your reply with "Therefore, the answer is (your answer)".\n\nYour answer:',
    "json": "Reply with a single JSON value and nothing else.\n\nYour answer:",
}
FINAL_ANSWER_TEMPLATES: dict[str, str] = {style: _FINAL_HEAD + end for style, end in _ANSWER_ENDINGS.items()}

# The full-context baseline: the same question and answer format, the whole document in one prompt.
_FULL_CONTEXT_HEAD = """Read the document below and answer the question about it.
{instruction}
<document>
{document}
</document>

<problem>
{question}
</problem>

"""
FULL_CONTEXT_TEMPLATES: dict[str, str] = {style: _FULL_CONTEXT_HEAD + end for style, end in _ANSWER_ENDINGS.items()}


def _instruction_line(instruction: str | None) -> str:
    return f"Task: {instruction.strip()}\n" if instruction else ""


def memory_update_messages(question: str, memory: str, chunk: str, instruction: str | None = None) -> Messages:
    """One memory-update conversation as chat messages (a single user turn)."""
    content = MEMORY_UPDATE_TEMPLATE.format(
        instruction=_instruction_line(instruction), question=question, memory=memory, chunk=chunk
    )
    return [{"role": "user", "content": content}]


def final_answer_messages(
    question: str, memory: str, style: AnswerStyle, instruction: str | None = None
) -> Messages:
    """The final-answer conversation: question and memory only, no document text."""
    content = FINAL_ANSWER_TEMPLATES[style].format(
        instruction=_instruction_line(instruction), question=question, memory=memory
    )
    return [{"role": "user", "content": content}]


def full_context_messages(
    question: str, document: str, style: AnswerStyle, instruction: str | None = None
) -> Messages:
    """The baseline's single conversation: the (possibly truncated) document and the question."""
    content = FULL_CONTEXT_TEMPLATES[style].format(
        instruction=_instruction_line(instruction), question=question, document=document
    )
    return [{"role": "user", "content": content}]


def strip_thinking(text: str) -> str:
    """Keep only what follows the last ``</think>`` (reasoning models), as the paper's eval did."""
    return text.rsplit("</think>", 1)[-1] if "</think>" in text else text


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` / ``\\fbox{…}`` / ``\\boxed x`` in ``text``, braces matched.

    >>> last_boxed(r"so \\boxed{a{b}c} and \\boxed{d}")
    'd'
    """
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    rest = text[idx:]
    if rest.startswith("\\boxed "):
        # "\boxed 5" form: the token after the space, up to the next '$' or whitespace.
        words = rest[len("\\boxed ") :].split("$")[0].split()
        return words[0] if words else None
    open_at = rest.find("{")
    if open_at < 0:
        return None
    depth = 0
    for i, ch in enumerate(rest[open_at:], start=open_at):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return rest[open_at + 1 : i]
    return None  # unbalanced


_PHRASE = re.compile(r"the answer is", re.IGNORECASE)


def extract_phrase_answer(text: str) -> str | None:
    """Text after the last "the answer is" (case-insensitive), trimmed of '.', '*' and spaces.

    None when the phrase is absent (spec §1.6).
    """
    text = strip_thinking(text).replace("*", "")
    matches = list(_PHRASE.finditer(text))
    if not matches:
        return None
    answer = text[matches[-1].end() :]
    answer = answer.lstrip(" :").split("\n")[0]
    return answer.strip().strip(".").strip() or None


def extract_boxed_answer(text: str) -> str | None:
    """The last boxed answer in the reply's final 300 characters (the training verifier's window)."""
    return last_boxed(strip_thinking(text)[-300:])


def parse_json_answer(text: str) -> Any:
    """Parse the reply as JSON, tolerating a ```json fence or text around one object/array.

    Raises ``ValueError`` with the reason when no JSON value can be read.
    """
    body = strip_thinking(text).strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", body, re.DOTALL)
    if fence:
        body = fence.group(1).strip()
    try:
        return json.loads(body)
    except json.JSONDecodeError as first_error:
        starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
        if starts:
            try:
                value, _ = json.JSONDecoder().raw_decode(body[min(starts) :])
                return value
            except json.JSONDecodeError:
                pass
        raise ValueError(f"reply is not valid JSON: {first_error.msg} at char {first_error.pos}") from None


def _clean_fallback(text: str) -> str | None:
    lines = [ln.strip() for ln in strip_thinking(text).replace("*", "").splitlines() if ln.strip()]
    return lines[-1].strip(".").strip() if lines else None


def extract_answer(text: str, style: AnswerStyle, strict: bool = False) -> str | None:
    """The prediction in a final reply. ``strict`` returns None when the style's marker is missing.

    For ``json`` the JSON text itself is returned (parse it with :func:`parse_json_answer`).
    """
    if style == "json":
        return strip_thinking(text).strip() or None
    found = extract_boxed_answer(text) if style == "boxed" else extract_phrase_answer(text)
    if found is not None or strict:
        return found
    # Small models often answer plainly; also accept the other style's marker before falling back.
    other = extract_phrase_answer(text) if style == "boxed" else extract_boxed_answer(text)
    return other if other is not None else _clean_fallback(text)
