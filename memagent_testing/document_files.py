"""Real document files rendered from known content, for the conversion tests and the benchmark.

PDFs are typeset by reportlab (paragraphs, ruled tables, a header and a footer on every page,
one or two columns, rotated pages), DOCX written by python-docx, HTML by hand with the
navigation, cookie banner and footer a real page has around its article. What went in is kept
(:class:`Rendered`), so a test checks the converter's text against it, not against itself.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

HEADER = "ACME Quarterly Filing - Confidential"
FOOTER_PREFIX = "Page"  # the footer is "Page N of M": varies by page, still repeated


@dataclass
class Rendered:
    """A rendered file and the content that went into it, in reading order."""

    data: bytes
    paragraphs: list[str]
    tables: list[list[list[str]]] = field(default_factory=list)
    pages: int = 1


def _styles():
    from reportlab.lib.styles import getSampleStyleSheet

    return getSampleStyleSheet()


def render_pdf(paragraphs: list[str], tables: list[list[list[str]]] = (), *, columns: int = 1,
               rotated_pages: tuple[int, ...] = (), header: bool = True, page_break_every: int = 0) -> Rendered:
    """A PDF of ``paragraphs`` then ``tables`` (ruled grids), a header and a "Page N" footer on every page.

    ``columns=2`` sets the body in two frames side by side; ``rotated_pages`` (1-based) get /Rotate 90;
    ``page_break_every`` starts a new page after every that many paragraphs (a long file).
    """
    from reportlab.lib import colors
    from reportlab.lib.pagesizes import A4
    from reportlab.platypus import BaseDocTemplate, Frame, PageBreak, PageTemplate, Paragraph, Spacer, Table, TableStyle

    buf = io.BytesIO()
    width, height = A4
    margin = 60
    gap = 20
    frame_w = (width - 2 * margin - (columns - 1) * gap) / columns
    frames = [Frame(margin + i * (frame_w + gap), margin, frame_w, height - 2 * margin, id=f"col{i}")
              for i in range(columns)]

    def decorate(canvas, doc):
        canvas.saveState()
        canvas.setFont("Helvetica", 8)
        if header:
            canvas.drawString(margin, height - 40, HEADER)
        canvas.drawString(width / 2 - 20, 30, f"{FOOTER_PREFIX} {doc.page}")
        canvas.restoreState()

    doc = BaseDocTemplate(buf, pagesize=A4, pageTemplates=[PageTemplate(id="body", frames=frames, onPage=decorate)])
    style = _styles()["BodyText"]
    story = []
    for i, p in enumerate(paragraphs):
        story.append(Paragraph(_escape(p), style))
        story.append(Spacer(1, 6))
        if page_break_every and (i + 1) % page_break_every == 0 and i + 1 < len(paragraphs):
            story.append(PageBreak())
    for t in tables:
        table = Table(t)
        table.setStyle(TableStyle([("GRID", (0, 0), (-1, -1), 0.5, colors.black),
                                   ("FONT", (0, 0), (-1, -1), "Helvetica", 9)]))
        story += [table, Spacer(1, 12)]
    doc.build(story)
    data = _rotate(buf.getvalue(), rotated_pages) if rotated_pages else buf.getvalue()
    return Rendered(data, list(paragraphs), [list(map(list, t)) for t in tables], doc.page)


def _rotate(data: bytes, pages: tuple[int, ...]) -> bytes:
    """``data`` with /Rotate 90 on ``pages`` (1-based), as a scanner or a landscape table sets it."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    for n in pages:
        writer.pages[n - 1].rotate(90)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_scanned_pdf(pages: int = 2) -> bytes:
    """A PDF whose pages are images of text only (a scan): no text layer."""
    from PIL import Image, ImageDraw
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen.canvas import Canvas

    img = Image.new("RGB", (400, 200), "white")
    ImageDraw.Draw(img).text((20, 80), "Scanned page: text only in pixels", fill="black")
    buf = io.BytesIO()
    c = Canvas(buf)
    for _ in range(pages):
        c.drawImage(ImageReader(img), 50, 500, 400, 200)
        c.showPage()
    c.save()
    return buf.getvalue()


def render_encrypted_pdf() -> bytes:
    """A PDF that needs a user password to open."""
    from reportlab.lib.pdfencrypt import StandardEncryption
    from reportlab.pdfgen.canvas import Canvas

    buf = io.BytesIO()
    c = Canvas(buf, encrypt=StandardEncryption("user-secret", "owner-secret", canPrint=0))
    c.drawString(100, 700, "A secret text")
    c.showPage()
    c.save()
    return buf.getvalue()


def render_blank_pdf() -> bytes:
    """A PDF with one page and nothing on it."""
    from reportlab.pdfgen.canvas import Canvas

    buf = io.BytesIO()
    c = Canvas(buf)
    c.showPage()
    c.save()
    return buf.getvalue()


def render_docx(paragraphs: list[str], tables: list[list[list[str]]] = (), *, page_break_after: int = 0,
                header: str | None = HEADER) -> Rendered:
    """A DOCX: a heading, ``paragraphs`` then ``tables``; a section header on every page; an explicit
    page break after paragraph ``page_break_after`` (1-based; 0 for none)."""
    from docx import Document
    from docx.enum.text import WD_BREAK

    doc = Document()
    if header:
        doc.sections[0].header.paragraphs[0].text = header
    for i, p in enumerate(paragraphs, 1):
        para = doc.add_paragraph(p)
        if i == page_break_after:
            para.add_run().add_break(WD_BREAK.PAGE)
    for t in tables:
        table = doc.add_table(rows=len(t), cols=len(t[0]))
        for r, row in enumerate(t):
            for c, cell in enumerate(row):
                table.cell(r, c).text = cell
    buf = io.BytesIO()
    doc.save(buf)
    return Rendered(buf.getvalue(), list(paragraphs), [list(map(list, t)) for t in tables],
                    2 if page_break_after else 1)


def render_html(paragraphs: list[str], tables: list[list[list[str]]] = (), *, title: str = "Quarterly report") -> Rendered:
    """An article page: ``paragraphs`` and ``tables`` inside <article>, with navigation, a cookie
    banner, a sidebar of links and a footer around it (boilerplate a converter must drop)."""
    from html import escape

    nav = "".join(f'<li><a href="/s{i}">Section {i} menu</a></li>' for i in range(8))
    body = "".join(f"<p>{escape(p)}</p>" for p in paragraphs)
    for t in tables:
        head = "".join(f"<th>{escape(c)}</th>" for c in t[0])
        rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in t[1:])
        body += f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    page = (f"<!DOCTYPE html><html><head><title>{escape(title)}</title></head><body>"
            f'<div id="cookie-banner">We use cookies to improve your experience. Accept all cookies</div>'
            f"<header><nav><ul>{nav}</ul></nav></header>"
            f"<main><article><h1>{escape(title)}</h1>{body}</article></main>"
            f'<aside><h3>Related links</h3><ul>{nav}</ul></aside>'
            f"<footer>Copyright 2026 Example Media. All rights reserved. Privacy policy | Terms of use</footer>"
            f"</body></html>")
    return Rendered(page.encode(), list(paragraphs), [list(map(list, t)) for t in tables])


SAMPLE_TABLE = [["Region", "Revenue", "Units"], ["North", "48,250", "1,200"], ["South", "31,900", "845"],
                ["West", "12,075", "310"]]


def sample_paragraphs(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct sentences of plain English-like text (each paragraph names its own number)."""
    words = ("revenue", "contract", "supplier", "delivery", "quarter", "invoice", "warehouse", "freight",
             "payment", "schedule", "clause", "shipment", "customer", "audit", "ledger", "margin")
    out = []
    for i in range(n):
        picked = [words[(seed + i * 7 + k * 3) % len(words)] for k in range(14)]
        out.append(f"Paragraph {i + 1} states that the " + " ".join(picked) + f" closed at {1000 + i * 37} units.")
    return out


def sample_lake() -> dict[str, bytes]:
    """A small mixed folder of statements (relative path -> bytes) for trying ``memagent batch --input`` with
    docs/schemas/statement.json: a 3-page PDF whose payments sit on pages 1 and 3, an HTML notice, a DOCX
    with a payments table, a text note, and two bad files (corrupt, encrypted)."""
    filler = sample_paragraphs(4)
    pdf = render_pdf(["Statement of account. Account holder: Jane Roe.", "Harlow Freight Ltd paid 1250 on 2021-03-14.",
                      filler[0], filler[1], "Brant Mills Ltd paid 880 on 2022-07-01.", filler[2]],
                     page_break_every=2).data
    html = render_html(["Payment notice for the account of Jane Roe.", "Corran Textiles Ltd paid 4410 on 2023-11-20."],
                       title="Payment notice").data
    docx = render_docx(["Quarterly payments received on the account of Jane Roe."],
                       [[["Payer", "Amount", "Date"], ["Delta Shipping Ltd", "310", "2024-01-05"]]], header=None).data
    return {"statements/ledger.pdf": pdf, "notices/notice.html": html, "reports/payments.docx": docx,
            "notes.txt": b"Account holder: Jane Roe.\nEcho Paper Ltd paid 95 on 2024-02-11.\n",
            "bad/corrupt.pdf": b"%PDF-1.7\n1 0 obj garbage", "bad/locked.pdf": render_encrypted_pdf()}
