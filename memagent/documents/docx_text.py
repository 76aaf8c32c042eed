"""DOCX to text through its document model (python-docx): paragraphs and tables in body order.

Section headers and footers (repeated on every page) are not body content and are left out.
A table row is one line (:func:`memagent.documents.layout.table_row`; a merged cell once).
DOCX has no fixed pages: page numbers follow the page breaks the file records (explicit breaks
and the breaks Word rendered when it last saved), so a file without any is one page.
"""

from __future__ import annotations

import io
import zipfile

from memagent.documents.layout import table_row, tidy
from memagent.documents.model import Document, DocumentError, join_pages

_OLE_MAGIC = b"\xd0\xcf\x11\xe0"  # a password-protected DOCX is an OLE container, not a zip
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"


def convert_docx(data: bytes) -> Document:
    """The document's body text in order with its page map; :class:`DocumentError` for a bad file."""
    from docx import Document as open_docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table

    if data.startswith(_OLE_MAGIC):
        raise DocumentError("encrypted", "encrypted: the DOCX is password-protected (or an old binary .doc)")
    try:
        doc = open_docx(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise DocumentError("corrupt", f"corrupt: not a readable DOCX ({exc})") from None
    pages: list[list[str]] = [[]]
    for block in doc.iter_inner_content():
        if isinstance(block, Table):
            pages[-1].extend(_table_rows(block))
            continue
        pages[-1].append(block.text)
        for _ in range(_page_breaks(block)):
            pages.append([])
    texts = [tidy("\n".join(lines)) for lines in pages]
    if not any(texts):
        raise DocumentError("empty", "empty: the DOCX has no text")
    text, spans = join_pages(texts)
    return Document(text, spans, "docx")


def _table_rows(table) -> list[str]:
    rows = []
    for row in table.rows:
        cells, seen = [], set()
        for cell in row.cells:
            if id(cell._tc) not in seen:  # a merged cell is repeated by python-docx: written once
                seen.add(id(cell._tc))
                cells.append(cell.text)
        rows.append(table_row(cells))
    return rows


def _page_breaks(paragraph) -> int:
    """Page breaks in the paragraph: explicit ones, or else those Word rendered."""
    explicit = sum(1 for br in paragraph._p.iter(f"{_W}br") if br.get(f"{_W}type") == "page")
    return explicit or len(list(paragraph._p.iter(f"{_W}lastRenderedPageBreak")))
