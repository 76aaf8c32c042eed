"""What a converted document is: its text, its page map, and the typed errors of a bad file."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Why a file could not be converted. The reason's first words say it (``no text layer: ...``).
ErrorKind = Literal["unsupported", "encrypted", "corrupt", "empty", "no_text_layer", "oversized"]


class DocumentError(ValueError):
    """A file that cannot be converted; ``str()`` is the one-line reason an error row shows."""

    def __init__(self, kind: ErrorKind, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class DocumentLimits(BaseModel):
    """What a converter accepts; a larger file is an ``oversized`` error, not a worker out of memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_bytes: int = Field(200 * 1024 * 1024, gt=0, json_schema_extra={"flag": "max-document-bytes"},
                           description="Largest document file converted, in bytes (a larger one is an error row).")
    max_pages: int = Field(5000, gt=0, json_schema_extra={"flag": "max-pdf-pages"},
                           description="Most pages of a PDF converted (a longer one is an error row).")


@dataclass(frozen=True)
class PageSpan:
    """Characters ``[start, end)`` of the document text come from page ``page`` (1-based).

    ``box`` is the PDF page's media box ``(x0, y0, x1, y1)`` in points and ``rotation`` its /Rotate
    (degrees); formats without a page geometry (HTML, DOCX, text) have ``box`` None.
    """

    page: int
    start: int
    end: int
    box: tuple[float, float, float, float] | None = None
    rotation: int = 0


@dataclass(frozen=True)
class Document:
    """A converted file: ``text`` in reading order, ``pages`` covering it in order without gaps
    between a page's spans (the separators between pages belong to no page)."""

    text: str
    pages: tuple[PageSpan, ...]
    format: str  # "pdf", "html", "docx" or "text"

    def pages_of(self, start: int, end: int) -> list[int]:
        """The page numbers the char span ``[start, end)`` touches (its start's page for an empty span)."""
        return pages_of(self.pages, start, end)


def pages_of(pages: tuple[PageSpan, ...] | list[PageSpan], start: int, end: int) -> list[int]:
    """The page numbers the char span ``[start, end)`` touches, ascending; an empty span (or one
    inside a separator between pages) takes the page it starts on or, failing that, the page before."""
    lo, hi = start, max(end, start + 1)
    i = max(bisect.bisect_right([p.start for p in pages], lo) - 1, 0)
    found = []
    for span in pages[i:]:
        if span.start >= hi:
            break
        if span.end > lo:
            found.append(span.page)
    if not found and pages and pages[i].start <= lo:
        found = [pages[i].page]
    return sorted(set(found))


def join_pages(page_texts: list[str], boxes: list[tuple[float, float, float, float] | None] | None = None,
               rotations: list[int] | None = None, separator: str = "\n\n") -> tuple[str, tuple[PageSpan, ...]]:
    """One text from the pages' texts (``separator`` between non-empty pages) and its page map."""
    parts: list[str] = []
    spans: list[PageSpan] = []
    at = 0
    for i, text in enumerate(page_texts):
        if not text:
            continue
        if parts:
            parts.append(separator)
            at += len(separator)
        parts.append(text)
        spans.append(PageSpan(i + 1, at, at + len(text), boxes[i] if boxes else None, rotations[i] if rotations else 0))
        at += len(text)
    return "".join(parts), tuple(spans)
