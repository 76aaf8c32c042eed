"""Evidence attribution: which memory step produced the answer, and where the gold answer went.

Every memory step records the span ``char_start:char_end`` of the chunk it read, so a string
in a memory can be traced to the text it came from. For one read (its ``steps``):

- **evidence**: the first memory step whose memory contains the final prediction, and that
  step's chunk span — the answer's *evidence span*;
- **gold answer** (when ``answers`` are known): where it occurs in the context (char offsets),
  the first memory step whose memory held it (*found*), and the first step after that whose
  memory no longer held it (*lost*: held after step m-1, absent after step m).

"Contains" follows the row's metric: SQuAD normalisation at word boundaries for
``sub_em``/``em``/``f1``, lowercase substrings for ``string_match_all`` (every reference must
be held, as the metric scores), MATH-style cleaning for ``boxed_em``. Pure functions, no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from memagent.verify import normalize_answer, strip_math

# At most this many occurrences of the gold answer are recorded per row.
MAX_ANSWER_SPANS = 20


@dataclass
class Attribution:
    """Attribution of one row; the fields are the batch output's attribution columns."""

    evidence_step: int | None = None
    evidence_char_start: int | None = None
    evidence_char_end: int | None = None
    answer_spans: list[dict[str, int]] | None = None
    answer_found_step: int | None = None
    answer_lost_step: int | None = None
    held: list[bool] = field(default_factory=list, repr=False)  # per memory step: held the gold answer

    def columns(self) -> dict[str, Any]:
        """The stored columns (``held`` is derived and not stored)."""
        d = asdict(self)
        d.pop("held")
        return d


COLUMNS = tuple(Attribution().columns())


def _get(step: Any, key: str) -> Any:
    return step.get(key) if isinstance(step, Mapping) else getattr(step, key, None)


def memory_steps(steps: Iterable[Any] | None) -> list[Any]:
    """The memory-update steps of a trace (dicts or :class:`memagent.agent.Step`), in order."""
    return [s for s in steps or [] if _get(s, "kind") in (None, "memory")]


def _words(text: str) -> str:
    return f" {normalize_answer(text)} "


def contains(metric: str, text: str | None, needle: str | None) -> bool:
    """``needle`` occurs in ``text`` as the metric compares strings (empty needles never do)."""
    if not text or not needle:
        return False
    if metric == "string_match_all":
        return needle.lower() in text.lower()
    if metric == "boxed_em":
        n = strip_math(needle.lower())
        return bool(n) and n in strip_math(text.lower())
    n = normalize_answer(needle)
    return bool(n) and f" {n} " in _words(text)


def holds(metric: str, text: str | None, answers: Sequence[str]) -> bool:
    """Whether ``text`` holds the gold answer, as the metric would credit it.

    ``sub_em`` scores against the first reference, ``string_match_all`` needs every
    reference, the others take the best reference (any).
    """
    refs = [a for a in answers if a]
    if not text or not refs:
        return False
    if metric == "sub_em":
        return contains(metric, text, refs[0])
    if metric == "string_match_all":
        return all(contains(metric, text, r) for r in refs)
    return any(contains(metric, text, r) for r in refs)


def answer_spans(context: str | None, answers: Sequence[str] | None,
                 limit: int = MAX_ANSWER_SPANS) -> list[dict[str, int]]:
    """Char offsets of the gold answers in ``context`` (case-insensitive), sorted, at most ``limit``."""
    if not context or not answers:
        return []
    haystack = context.lower()
    spans: set[tuple[int, int]] = set()
    for answer in answers:
        needle = (answer or "").strip().lower()
        if not needle:
            continue
        start = haystack.find(needle)
        while start != -1 and len(spans) < 4 * limit:
            spans.add((start, start + len(needle)))
            start = haystack.find(needle, start + 1)
    return [{"char_start": a, "char_end": b} for a, b in sorted(spans)[:limit]]


Span = tuple[int | None, int | None, int | None]


def evidence(steps: Iterable[Any] | None, prediction: str | None, metric: str = "sub_em") -> Span:
    """(step, char_start, char_end) of the first memory step whose memory contains ``prediction``."""
    if not prediction:
        return None, None, None
    for s in memory_steps(steps):
        if contains(metric, _get(s, "memory"), prediction):
            return _get(s, "step"), _get(s, "char_start"), _get(s, "char_end")
    return None, None, None


def found_and_lost(held: Sequence[bool], step_ids: Sequence[int]) -> tuple[int | None, int | None]:
    """First step that held the answer, and the first later step that no longer did."""
    found = lost = None
    for i, h in enumerate(held):
        if h and found is None:
            found = step_ids[i]
        elif not h and found is not None and held[i - 1]:
            lost = step_ids[i]
            break
    return found, lost


def attribute(steps: Iterable[Any] | None, prediction: str | None, answers: Sequence[str] | None = None,
              context: str | None = None, metric: str = "sub_em") -> Attribution:
    """Attribution of one read: evidence step/span of ``prediction``; found/lost steps of ``answers``."""
    mem = memory_steps(steps)
    step, start, end = evidence(mem, prediction, metric)
    out = Attribution(evidence_step=step, evidence_char_start=start, evidence_char_end=end)
    refs = [str(a) for a in answers or [] if a is not None]
    if refs:
        out.answer_spans = answer_spans(context, refs) if isinstance(context, str) else None
        out.held = [holds(metric, _get(s, "memory"), refs) for s in mem]
        out.answer_found_step, out.answer_lost_step = found_and_lost(out.held, [_get(s, "step") for s in mem])
    return out
