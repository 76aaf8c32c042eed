"""PDF to text: pypdfium2 for the text layer, pdfplumber for ruled tables.

Chosen by measurement (benchmarks/documents.py, benchmarks/README.md): pypdfium2 reads the text
layer ~5x faster than pypdf and ~90x faster than pdfplumber, keeps the content stream's reading
order (a two-column page comes out column by column, where pdfplumber's line-by-line layout
interleaves the columns) and puts a table row on one line; only pdfplumber finds a table's cells.
So pdfplumber runs only on pages that draw lines (a ruled table needs them) and only its table
finder: the chars pdfium places inside a found table are replaced by the table's rows, one line
each, cells separated (:func:`memagent.documents.layout.table_row`). A page with /Rotate is read
unrotated (pdfium would order its lines as displayed, sideways: last line first); its tables are
found on an unrotated copy of the file (made once, for the first rotated page that draws lines), so
the finder's coordinates are pdfium's there too.
"""

from __future__ import annotations

import io
from typing import Any

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from memagent.documents.layout import drop_page_furniture, table_row, tidy
from memagent.documents.model import Document, DocumentError, DocumentLimits, join_pages

_SOFT_HYPHEN = "\ufffe"  # pdfium: a "-" ending a line, which it joins to the next line (as a hyphenated word)
_INSIDE_TOLERANCE = 1.0  # points: a char whose centre is this close to a table's box is in it


def convert_pdf(data: bytes, limits: DocumentLimits) -> Document:
    """The PDF's text in reading order with its page map; :class:`DocumentError` for a bad file."""
    doc = _open(data)
    tables = _TableFinder(data)
    try:
        n = len(doc)
        if n == 0:
            raise DocumentError("empty", "empty: the PDF has no pages")
        if n > limits.max_pages:
            raise DocumentError("oversized", f"oversized: {n} pages, more than the limit of {limits.max_pages}")
        pages, boxes, rotations, images = [], [], [], 0
        for i in range(n):
            page = doc[i]
            try:
                boxes.append(tuple(round(v, 2) for v in page.get_mediabox()))
                rotations.append(page.get_rotation())
                text, has_image = _page_text(page, i, tables)
                pages.append(text.split("\n"))
                images += has_image
            finally:
                page.close()
    finally:
        tables.close()
        doc.close()
    texts = [tidy("\n".join(lines)) for lines in drop_page_furniture(pages)]
    if not any(texts):
        if images:
            raise DocumentError("no_text_layer", "no text layer: scanned PDF, OCR is not built in")
        raise DocumentError("empty", f"empty: no text on any of the {n} page(s)")
    text, spans = join_pages(texts, boxes, rotations)
    return Document(text, spans, "pdf")


def _open(data: bytes) -> pdfium.PdfDocument:
    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        if "password" in str(exc).lower():
            raise DocumentError("encrypted", "encrypted: the PDF needs a password to open") from None
        raise DocumentError("corrupt", f"corrupt: not a readable PDF ({exc})") from None


def _page_text(page: pdfium.PdfPage, index: int, tables: _TableFinder) -> tuple[str, bool]:
    """The page's text (tables as rows) and whether it shows an image."""
    kinds = {obj.type for obj in page.get_objects(max_depth=2)}
    rotated = page.get_rotation() != 0
    if rotated:  # pdfium orders a rotated page's text as it is displayed: sideways lines, last first
        page.set_rotation(0)  # in memory only: the content stream's own order
    textpage = page.get_textpage()
    try:
        text = textpage.get_text_range()
        found = tables.on_page(index, rotated) if pdfium_c.FPDF_PAGEOBJ_PATH in kinds else []
        if found and len(text) == textpage.count_chars():
            text = _with_table_rows(text, textpage, found, page.get_height())
    finally:
        textpage.close()
    return text.replace(_SOFT_HYPHEN, "-\n").replace("\r\n", "\n"), pdfium_c.FPDF_PAGEOBJ_IMAGE in kinds


def _with_table_rows(text: str, textpage: pdfium.PdfTextPage, tables: list[tuple[tuple, list]], height: float) -> str:
    """``text`` with each table's chars replaced by its rows, where the table's first char was."""
    boxes = [(x0 - _INSIDE_TOLERANCE, height - bottom - _INSIDE_TOLERANCE, x1 + _INSIDE_TOLERANCE,
              height - top + _INSIDE_TOLERANCE) for (x0, top, x1, bottom), _ in tables]
    out: list[str] = []
    written: set[int] = set()
    for i, ch in enumerate(text):
        left, bottom, right, top = textpage.get_charbox(i)
        cx, cy = (left + right) / 2, (bottom + top) / 2
        inside = next((k for k, (x0, y0, x1, y1) in enumerate(boxes)
                       if (left or right) and x0 <= cx <= x1 and y0 <= cy <= y1), None)
        if inside is None:
            out.append(ch)
        elif inside not in written:
            written.add(inside)
            out.append("\n" + "\n".join(table_row(row) for row in tables[inside][1]) + "\n")
    return "".join(out)


class _TableFinder:
    """pdfplumber's ruled-table finder, opened on the first page that needs it; each page's parsed
    objects are released after use, so memory stays flat over a long file. pdfplumber lays a page
    out as displayed (rotated): for a rotated page it reads an unrotated copy of the file instead."""

    def __init__(self, data: bytes):
        self.data = data
        self.pdf: Any = None
        self.unrotated = False

    def on_page(self, index: int, rotated: bool = False) -> list[tuple[tuple, list]]:
        """(bbox as pdfplumber gives it: x0, top, x1, bottom; rows of cell texts) per table found."""
        if rotated and not self.unrotated:  # upright pages read the same in the copy: one finder from here on
            self.close()
            self.data, self.pdf, self.unrotated = _unrotated(self.data), None, True
        if self.pdf is None:
            import pdfplumber

            self.pdf = pdfplumber.open(io.BytesIO(self.data))
        page = self.pdf.pages[index]
        try:
            return [(t.bbox, t.extract()) for t in page.find_tables()]
        finally:
            page.close()

    def close(self) -> None:
        if self.pdf is not None:
            self.pdf.close()


def _unrotated(data: bytes) -> bytes:
    """The PDF with every page's /Rotate set to 0 (what pdfium reads a rotated page as)."""
    doc = pdfium.PdfDocument(data)
    try:
        for i in range(len(doc)):
            page = doc[i]
            page.set_rotation(0)
            page.close()
        out = io.BytesIO()
        doc.save(out)
        return out.getvalue()
    finally:
        doc.close()
