"""The input columns a converted document brings to a batch job (and on into its output), in Arrow.

``pages`` is the page map (:class:`memagent.documents.model.PageSpan` per page: ``page``,
``char_start``/``char_end`` into ``context``, the PDF page's ``box`` and ``rotation``);
``document_sha256`` the file's content hash (what a rerun compares: a changed file is a changed
input); ``document_error`` the reason a file could not be converted (its ``context`` is null and
its output row an ``input:`` error naming the file and the reason).
"""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa

from memagent.documents.model import PageSpan

PAGES_COLUMN = "pages"
DOCUMENT_SHA_COLUMN = "document_sha256"
DOCUMENT_ERROR_COLUMN = "document_error"
PAGE_TYPE = pa.struct([("page", pa.int32()), ("char_start", pa.int64()), ("char_end", pa.int64()),
                       ("box", pa.list_(pa.float64())), ("rotation", pa.int16())])
DOCUMENT_COLUMNS = pa.schema([("id", pa.string()), ("context", pa.string()),
                              (PAGES_COLUMN, pa.list_(PAGE_TYPE)), (DOCUMENT_SHA_COLUMN, pa.string()),
                              (DOCUMENT_ERROR_COLUMN, pa.string())])


def page_rows(pages: Iterable[PageSpan]) -> list[dict[str, Any]]:
    """The ``pages`` column's value for a document's page map."""
    return [{"page": p.page, "char_start": p.start, "char_end": p.end, "box": list(p.box) if p.box else None,
             "rotation": p.rotation} for p in pages]


def page_spans(rows: Iterable[dict[str, Any]] | None) -> list[PageSpan]:
    """The page map back from a ``pages`` column value (None: no map)."""
    return [PageSpan(r["page"], r["char_start"], r["char_end"], tuple(r["box"]) if r.get("box") else None,
                     r.get("rotation") or 0) for r in rows or ()]
