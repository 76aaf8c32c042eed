"""The answer in a model's reply: its reasoning dropped, then the boxed answer, the phrase after "the answer is",
or a JSON value, as :data:`AnswerStyle` asks (the styles the final-answer prompt asks for,
:data:`memagent.prompts.ANSWER_INSTRUCTIONS`).

Public through :mod:`memagent.prompts` too, where the conversations these replies answer are built.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

# The styles the final answer is asked for and extracted in; defined here, beside the extractors
# (memagent.prompts, which config.py imports for AgentConfig.prompts, takes it from here).
AnswerStyle = Literal["boxed", "phrase", "json"]


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

    None when the phrase is absent (the official code's extraction).
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
