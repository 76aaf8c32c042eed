"""HTML to text: the page's main content through trafilatura, not every tag's text.

trafilatura finds the article and leaves navigation, cookie banners, sidebars and footers out
(what a tag stripper keeps); its tables come one row per line as ``| a | b |``, which become
:func:`memagent.documents.layout.table_row` lines. An HTML page is one page.

Its own extraction is kept however short (``MIN_EXTRACTED_SIZE`` 1, recall favoured): by default an article
under 250 characters goes to a fallback extractor that writes each table cell on a line of its own (the rows
lost) and keeps the navigation; a page where it finds nothing still goes there.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from memagent.documents.layout import table_row, tidy
from memagent.documents.model import Document, DocumentError, PageSpan

_RULE_ROW = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")  # the |---|---| line under a table's header


@functools.cache
def _config() -> Any:
    from trafilatura.settings import use_config

    config = use_config()
    config.set("DEFAULT", "MIN_EXTRACTED_SIZE", "1")
    return config


def convert_html(data: bytes) -> Document:
    """The page's main content as text (one page); :class:`DocumentError` when there is none."""
    import trafilatura

    try:
        text = trafilatura.extract(data, include_tables=True, include_comments=False, include_links=False,
                                   include_images=False, output_format="txt", with_metadata=False,
                                   favor_recall=True, config=_config())
    except (ValueError, TypeError) as exc:  # an undecodable or malformed page
        raise DocumentError("corrupt", f"corrupt: not a readable HTML page ({exc})") from None
    text = tidy("\n".join(_line(line) for line in (text or "").split("\n") if not _RULE_ROW.match(line.strip())))
    if not text:
        raise DocumentError("empty", "empty: no main text found in the HTML page")
    return Document(text, (PageSpan(1, 0, len(text)),), "html")


def _line(line: str) -> str:
    """A ``| a | b |`` table line as a table row; any other line as it is."""
    stripped = line.strip()
    if len(stripped) > 1 and stripped.startswith("|") and stripped.endswith("|"):
        return table_row(stripped[1:-1].split("|"))
    return line
