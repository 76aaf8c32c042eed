"""Text layout rules every converter shares: how a table row is written, which lines are page
furniture (headers and footers repeated on every page), how whitespace is tidied."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable

CELL_SEPARATOR = " | "  # a table row is one line, its cells joined by this
EDGE_LINES = 3  # lines at a page's top and bottom looked at for headers and footers
REPEATED_SHARE = 0.6  # a line on at least this share of pages' edges (and on 2 pages) is furniture
MAX_FURNITURE_CHARS = 160  # longer lines are body text, however often they repeat

_DIGITS = re.compile(r"\d+")
_BLANK_RUNS = re.compile(r"\n{3,}")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")


def table_row(cells: Iterable[str | None]) -> str:
    """One table row as one line: each cell's whitespace collapsed (a cell's own line breaks too)."""
    return CELL_SEPARATOR.join(" ".join((c or "").split()) for c in cells)


def tidy(text: str) -> str:
    """Newlines as ``\\n``, no trailing spaces on a line, at most one blank line in a row, no edge blanks."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return _BLANK_RUNS.sub("\n\n", _TRAILING_SPACE.sub("\n", text)).strip()


def _furniture_key(line: str) -> str:
    """A line with its numbers blanked: "Page 3 of 9" and "Page 4 of 9" are the same footer."""
    return _DIGITS.sub("#", " ".join(line.split())).casefold()


def _edges(lines: list[str]) -> list[int]:
    """Indexes of the first and last :data:`EDGE_LINES` non-blank lines of a page."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    return sorted(set(filled[:EDGE_LINES] + filled[-EDGE_LINES:]))


def drop_page_furniture(pages: list[list[str]]) -> list[list[str]]:
    """The pages' lines without the headers and footers repeated on most pages.

    A line is furniture when, with its numbers blanked, it is among the top or bottom
    :data:`EDGE_LINES` lines of at least :data:`REPEATED_SHARE` of the pages (and of two pages at
    least): running heads, "Page N of M", a bare page number. Only edge lines are dropped, so the
    same words in the body stay.
    """
    if len(pages) < 2:
        return pages
    counts: Counter[str] = Counter()
    for lines in pages:
        counts.update({_furniture_key(lines[i]) for i in _edges(lines) if len(lines[i]) <= MAX_FURNITURE_CHARS})
    need = max(2, math.ceil(REPEATED_SHARE * len(pages)))
    repeated = {key for key, n in counts.items() if n >= need}
    if not repeated:
        return pages
    out = []
    for lines in pages:
        drop = {i for i in _edges(lines) if len(lines[i]) <= MAX_FURNITURE_CHARS and _furniture_key(lines[i]) in repeated}
        out.append([line for i, line in enumerate(lines) if i not in drop])
    return out
