"""Pages of evidence: every char span a result row holds, with the page numbers it lies on.

One mapping step after a row is read, so that nothing that produces spans needs to know pages:
it walks the row's evidence-bearing columns (``steps``, ``answer_spans``, ``field_evidence``,
each ``records_<type>`` with its ``record_evidence`` and ``record_conflicts``, and the answer's
``evidence_char_start``/``evidence_char_end``) for objects with ``char_start`` and ``char_end``
and maps each through the document's page map (:func:`memagent.documents.pages_of`). The
result is the ``evidence_pages`` column: one entry per span, named by where it is in the row
(``steps[3]``, ``field_evidence[0]``, ``records_invoice[1].record_evidence[2]``, ``evidence``).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import pyarrow as pa

from memagent.documents.model import PageSpan, pages_of
from memagent.result_schema import FIELD_EVIDENCE_COLUMN, RECORDS_PREFIX

EVIDENCE_PAGES_COLUMN = "evidence_pages"
EVIDENCE_PAGES_TYPE = pa.list_(pa.struct([("span", pa.string()), ("char_start", pa.int64()),
                                          ("char_end", pa.int64()), ("pages", pa.list_(pa.int32()))]))
_SPAN_COLUMNS = ("steps", "answer_spans", FIELD_EVIDENCE_COLUMN)


def _spans(value: Any, where: str) -> Iterator[tuple[str, int, int]]:
    """(where, start, end) of every object with integer ``char_start``/``char_end`` inside ``value``."""
    if isinstance(value, Mapping):
        start, end = value.get("char_start"), value.get("char_end")
        if isinstance(start, int) and isinstance(end, int):
            yield where, start, end
        for key, inner in value.items():
            if isinstance(inner, (list, tuple, Mapping)):
                yield from _spans(inner, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, inner in enumerate(value):
            yield from _spans(inner, f"{where}[{i}]")


def evidence_pages(record: Mapping[str, Any], pages: list[PageSpan]) -> list[dict[str, Any]] | None:
    """The ``evidence_pages`` value of a result record read from a document with page map ``pages``
    (None for a row without a page map)."""
    if not pages:
        return None
    found: list[tuple[str, int, int]] = []
    start, end = record.get("evidence_char_start"), record.get("evidence_char_end")
    if isinstance(start, int) and isinstance(end, int):
        found.append(("evidence", start, end))
    for column, value in record.items():
        if column in _SPAN_COLUMNS or column.startswith(RECORDS_PREFIX):
            found.extend(_spans(value, column))
    return [{"span": where, "char_start": s, "char_end": e, "pages": pages_of(pages, s, e)} for where, s, e in found]


def page_label(page_numbers: list[int] | None) -> str:
    """How a report writes a span's pages: "p. 14", "pp. 14-15", "pp. 3, 7"; "" for none."""
    if not page_numbers:
        return ""
    if len(page_numbers) == 1:
        return f"p. {page_numbers[0]}"
    if page_numbers == list(range(page_numbers[0], page_numbers[-1] + 1)):
        return f"pp. {page_numbers[0]}-{page_numbers[-1]}"
    return "pp. " + ", ".join(map(str, page_numbers))


def record_evidence_pages(row_entries: list[Mapping[str, Any]] | None, column: str,
                          n_records: int) -> list[list[dict[str, Any]] | None]:
    """Each record's part of its row's ``evidence_pages`` (``row_entries``): for record ``j`` of the row's
    ``column`` (``records_<type>``) the entries of ``column[j]``, named from the record on
    (``record_evidence[2]``); None for every record of a row without a page map."""
    if row_entries is None:
        return [None] * n_records
    out: list[list[dict[str, Any]] | None] = [[] for _ in range(n_records)]
    head = f"{column}["
    for entry in row_entries:
        span = entry["span"]
        if not span.startswith(head):
            continue
        index, _, rest = span[len(head):].partition("].")
        if index.isdigit() and int(index) < n_records and rest:
            out[int(index)].append({**entry, "span": rest})
    return out
