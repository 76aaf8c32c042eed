"""Capture and retention: which known evidence the memory took in, and which of it survived to the answer.

A document with known evidence (RULER needles, HotpotQA supporting paragraphs, the records
generator's payments) is a list of :class:`KnownEvidence`: a value at a char span of the context. A
read is its memory steps: step ``t`` read the text up to ``char_end[t]`` and wrote ``memory[t]``.
Per step and evidence item (an ``n_steps × n_evidence`` table, :func:`timeline`):

- **read**: the read has passed the item's whole span (``span_end <= char_end[t]``);
- **held**: the memory after step ``t`` holds the value, by grounding's matching rules
  (:func:`memagent.extraction.grounding.locate`: the value's written forms, case-insensitive, on word
  boundaries; a number or date in any spelling that reads as it; no fuzzy match).

Per item at the end (:func:`item_outcomes`): **captured** when held at some step at or after the
step that read it (a value held before it was read is a guess, not a capture), **retained** when the
last memory (the one the answer reads) holds it; **lost** = captured and not retained. A memory of
K heads (``AgentConfig.memory_heads``) is one text holding all heads, so the same rules apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from memagent.extraction.grounding import locate
from memagent.extraction.kinds import FieldKind


@dataclass(frozen=True)
class KnownEvidence:
    """One fact the document states: ``value`` (what the memory must hold, of ``kind``) at ``text[start:end]``."""

    label: str
    value: Any
    start: int
    end: int
    kind: FieldKind = "string"


@dataclass(frozen=True)
class ItemOutcome:
    """One evidence item over a read: the step that read it (None: never read, e.g. centre truncation),
    the steps whose memory held it (ascending), and the two end results."""

    label: str
    read_at: int | None
    held_at: tuple[int, ...]
    captured: bool
    retained: bool


def holds(memory: str, item: KnownEvidence) -> bool:
    """Whether ``memory`` holds ``item``'s value (grounding's exact and normalised matches, no fuzzy one)."""
    return locate(item.kind, item.value, memory, fuzzy=False) is not None


def timeline(evidence: Sequence[KnownEvidence], steps: Sequence[tuple[int, str]]) -> list[list[tuple[bool, bool]]]:
    """The ``n_steps × n_evidence`` table of ``(read, held)``.

    Args:
        evidence: ``n_evidence`` items.
        steps: ``n_steps`` memory steps in order, each ``(char_end, memory written)``; ``char_end``
            non-decreasing (the spans tile the document).
    """
    return [[(item.end <= end, holds(memory, item)) for item in evidence] for end, memory in steps]


def item_outcomes(evidence: Sequence[KnownEvidence], steps: Sequence[tuple[int, str]]) -> list[ItemOutcome]:
    """Per item: read step, held steps, captured (held at or after its read step), retained (held at the last)."""
    table = timeline(evidence, steps)
    out = []
    for j, item in enumerate(evidence):
        read_at = next((t for t, row in enumerate(table) if row[j][0]), None)
        held_at = tuple(t for t, row in enumerate(table) if row[j][1])
        captured = read_at is not None and any(t >= read_at for t in held_at)
        retained = captured and bool(table) and table[-1][j][1]
        out.append(ItemOutcome(item.label, read_at, held_at, captured, retained))
    return out


def summarise(outcomes: Sequence[ItemOutcome]) -> dict[str, Any]:
    """One document's counts and rates: ``n_evidence``, ``n_read``, ``n_captured``, ``n_retained``, ``capture``
    (captured / read: what the memory took in), ``retention`` (retained / captured: what it kept of that) and
    ``end_to_end`` (retained / read = capture × retention); a rate over nothing is None."""
    n_read = sum(o.read_at is not None for o in outcomes)
    n_cap = sum(o.captured for o in outcomes)
    n_ret = sum(o.retained for o in outcomes)
    return {"n_evidence": len(outcomes), "n_read": n_read, "n_captured": n_cap, "n_retained": n_ret,
            "capture": _rate(n_cap, n_read), "retention": _rate(n_ret, n_cap), "end_to_end": _rate(n_ret, n_read)}


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def memory_steps(steps: Iterable[Any]) -> list[tuple[int, str]]:
    """``(char_end, memory)`` of each memory step of a trace (:class:`memagent.agent.Step` objects or their dicts)."""
    out = []
    for s in steps:
        get = s.get if isinstance(s, Mapping) else lambda k, s=s: getattr(s, k)
        if get("kind") == "memory":
            out.append((int(get("char_end")), str(get("memory"))))
    return out


# -- evidence of the generated data sets -------------------------------------------------------------


def _spans_of(context: str, value: str, label: str, kind: FieldKind = "string") -> list[KnownEvidence]:
    """Every occurrence of ``value`` in ``context`` as one item each (a needle value is planted once)."""
    out, i = [], context.find(value)
    while i != -1:
        out.append(KnownEvidence(label, value, i, i + len(value), kind))
        i = context.find(value, i + 1)
    return out


def ruler_evidence(row: Mapping[str, Any]) -> list[KnownEvidence]:
    """A RULER NIAH row's queried needles: each answer value where the context states it."""
    return [e for k, a in enumerate(row["answers"]) for e in _spans_of(row["context"], str(a), f"needle {k}")]


def hotpot_evidence(row: Mapping[str, Any]) -> list[KnownEvidence]:
    """A HotpotQA row's supporting paragraphs (``gold_positions``, 1-based): each its title, at its ``Document i:`` block."""
    context, out = row["context"], []
    for pos in row.get("gold_positions") or []:
        head = f"Document {pos}:\n"
        start = context.find(head)
        if start < 0:
            raise ValueError(f"row {row.get('id')!r}: gold position {pos} has no 'Document {pos}:' block in its context")
        body = start + len(head)
        end = context.find("\n\nDocument ", body)
        end = len(context) if end < 0 else end
        title = context[body:end].split("\n", 1)[0]
        out.append(KnownEvidence(f"doc {pos}", title, body, end))
    return out


def row_evidence(row: Mapping[str, Any]) -> list[KnownEvidence]:
    """The known evidence of an evaluation row: a NIAH task's queried needles, qa_2's supporting paragraphs;
    none for the other tasks (their answers are not stated at one place)."""
    task = str(row.get("task") or "")
    if task.startswith("niah") and row.get("answers") is not None:
        return ruler_evidence(row)
    if task == "qa_2" and row.get("gold_positions") is not None:
        return hotpot_evidence(row)
    return []


def row_retention(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """:func:`summarise` of an output row's trace (``steps``) against its :func:`row_evidence`; None without any."""
    evidence = row_evidence(row)
    if not evidence or not row.get("steps"):
        return None
    return summarise(item_outcomes(evidence, memory_steps(row["steps"])))


def retention_columns(row: Mapping[str, Any], steps: Iterable[Any]) -> dict[str, int | None]:
    """A batch output row's ``evidence_read``, ``evidence_captured``, ``evidence_retained`` (all None for a row
    without known evidence, or a read without memory steps: the full-context baseline)."""
    evidence, mem = row_evidence(row), memory_steps(steps)
    if not evidence or not mem:
        return dict.fromkeys(("evidence_read", "evidence_captured", "evidence_retained"))
    s = summarise(item_outcomes(evidence, mem))
    return {"evidence_read": s["n_read"], "evidence_captured": s["n_captured"], "evidence_retained": s["n_retained"]}


def records_evidence(doc: Mapping[str, Any]) -> list[KnownEvidence]:
    """A generated statement's (:func:`memagent.data.records_corpus.statement`) gold payments: each amount, at
    the last line stating it (an amendment's corrected amount is on its amendment line)."""
    lines = doc["text"].split("\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    out = []
    for k, rec in enumerate(doc["gold"]):
        i = max(rec["lines"])
        out.append(KnownEvidence(f"{rec['payer']} {rec['date']}", rec["amount"], starts[i], starts[i] + len(lines[i]), "number"))
    return out


def plot_timeline(evidence: Sequence[KnownEvidence], steps: Sequence[tuple[int, str]], path: Any, title: str = "") -> Any:
    """One document's evidence over its steps: a row per item, a column per step; grey where not yet read,
    green where the memory holds it, red where read and not held (lost, or never captured). Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    table = timeline(evidence, steps)  # n_steps × n_evidence of (read, held)
    grid = [[0 if not table[t][j][0] else 2 if table[t][j][1] else 1 for t in range(len(table))]
            for j in range(len(evidence))]  # n_evidence × n_steps
    fig, ax = plt.subplots(figsize=(0.25 * max(len(table), 8) + 2, 0.35 * max(len(evidence), 2) + 1.2))
    ax.imshow(grid, cmap=ListedColormap(["#dddddd", "#d62728", "#2ca02c"]), vmin=0, vmax=2, aspect="auto",
              interpolation="nearest")
    ax.set_yticks(range(len(evidence)), [e.label for e in evidence])
    ax.set_xlabel("memory step  (grey: unread · green: held · red: read, not held)")
    ax.set_title(title or "KnownEvidence in memory per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
