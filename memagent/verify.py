"""Answer verifiers: the paper's evaluation metrics and its strict training reward.

Evaluation (lenient): SQuAD/HotpotQA normalisation, then ``sub_em`` (either string contains the
other), ``em``, token ``f1``; ``string_match_all`` for NIAH/VT/FWE (fraction of references
found). Training (strict): the last ``\\boxed{}`` of the final 300 characters must equal a
reference after MATH-style cleaning (case and spaces folded, punctuation kept).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Sequence, Literal

from memagent.replies import last_boxed, strip_thinking

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _first(references: str | Sequence[str]) -> str | None:
    if isinstance(references, str):
        return references
    return references[0] if len(references) else None


def sub_em(prediction: str | None, references: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction contains the first reference or is contained in it.

    An empty or missing prediction scores 0 (as the paper's eval). As in the paper, a
    non-empty prediction that normalises to "" (only punctuation/articles) counts as contained.
    """
    gold = _first(references)
    if not prediction or gold is None:
        return 0.0
    p, g = normalize_answer(prediction), normalize_answer(gold)
    return float(g in p or p in g)


def em(prediction: str | None, references: str | Sequence[str]) -> float:
    """Exact match after normalisation, best over references."""
    refs = [references] if isinstance(references, str) else list(references)
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(r) for r in refs))


def f1(prediction: str | None, references: str | Sequence[str]) -> float:
    """Token F1 (HotpotQA style, with its yes/no/noanswer guard), best over references."""
    refs = [references] if isinstance(references, str) else list(references)
    if prediction is None:
        return 0.0
    return max((_f1_one(prediction, r) for r in refs), default=0.0)


def _f1_one(prediction: str, reference: str) -> float:
    p, g = normalize_answer(prediction), normalize_answer(reference)
    special = {"yes", "no", "noanswer"}
    if (p in special or g in special) and p != g:
        return 0.0
    p_tokens, g_tokens = p.split(), g.split()
    common = Counter(p_tokens) & Counter(g_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(p_tokens), overlap / len(g_tokens)
    return 2 * precision * recall / (precision + recall)


def string_match_all(prediction: str | None, references: Iterable[str]) -> float:
    """Fraction of references whose lowercase form occurs in the lowercase prediction (RULER)."""
    refs = list(references)
    if not refs:
        raise ValueError("string_match_all needs at least one reference")
    pred = (prediction or "").lower()
    return sum(r.lower() in pred for r in refs) / len(refs)


def contains_any(response: str | None, references: Iterable[str]) -> float:
    """1.0 if any lowercase reference is a substring of the lowercase raw response (no-context filter)."""
    text = (response or "").lower()
    return float(any(r.lower() in text for r in references))


def strip_math(text: str) -> str:
    """MATH-style ``strip_string`` as the training verifier applies it (spaces removed last)."""
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\left", "").replace("\\right", "")
    text = text.replace("^{\\circ}", "").replace("^\\circ", "")
    text = text.replace("\\$", "").replace("\\%", "").replace("%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if text.startswith("."):
        text = "0" + text
    return text.replace(" ", "")


def boxed_em(response: str | None, references: str | Sequence[str]) -> float:
    """Strict training reward: last boxed answer in the response's final 300 chars equals a reference.

    Both sides lowercased and cleaned by :func:`strip_math`; no box scores 0.
    """
    if not response:
        return 0.0
    boxed = last_boxed(strip_thinking(response)[-300:].lower())
    if boxed is None:
        return 0.0
    refs = [references] if isinstance(references, str) else list(references)
    pred = strip_math(boxed)
    return float(any(pred == strip_math(r.lower()) for r in refs))


Metric = Literal["sub_em", "em", "f1", "string_match_all", "boxed_em"]
METRICS = {"sub_em": sub_em, "em": em, "f1": f1, "string_match_all": string_match_all, "boxed_em": boxed_em}


def score(metric: str, prediction: str | None, references: Sequence[str]) -> float:
    """Score with a metric by name (one of :data:`METRICS`)."""
    try:
        fn = METRICS[metric]
    except KeyError:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}") from None
    return fn(prediction, references)
