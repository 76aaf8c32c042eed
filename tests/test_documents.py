"""Conversion of real files the tests render (reportlab PDFs, python-docx DOCX, HTML pages) to text
with a page map: known text back in order, table rows kept, page furniture and boilerplate dropped,
bad files as typed errors."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memagent.documents import Document, DocumentError, DocumentLimits, convert, converter_version, pages_of
from memagent.documents.layout import table_row
from memagent.documents.model import PageSpan
from memagent_testing.document_files import (
    FOOTER_PREFIX, HEADER, SAMPLE_TABLE, render_blank_pdf, render_docx, render_encrypted_pdf, render_html, render_pdf,
    render_scanned_pdf, sample_paragraphs,
)


def flat(text: str) -> str:
    return " ".join(text.split())


def assert_in_order(doc: Document, paragraphs: list[str]) -> list[int]:
    """Every paragraph is in the text (whitespace aside), each after the one before; their offsets in flat text."""
    text, at, found = flat(doc.text), 0, []
    for p in paragraphs:
        i = text.find(flat(p), at)
        assert i >= 0, f"paragraph missing or out of order: {p!r}"
        found.append(i)
        at = i + len(flat(p))
    return found


def assert_rows(doc: Document, table: list[list[str]]) -> None:
    """Each table row is one line of the text, its cells separated, the rows in order."""
    lines = [flat(line) for line in doc.text.split("\n")]
    at = -1
    for row in table:
        line = flat(table_row(row))
        assert line in lines[at + 1:], f"row {row} not a line after line {at}"
        at = lines.index(line, at + 1)


def assert_page_map(doc: Document) -> None:
    """The page map covers the text in order, pages ascending, spans inside the text and disjoint."""
    assert doc.pages
    prev = PageSpan(0, 0, 0)
    for span in doc.pages:
        assert span.page > prev.page and span.start >= prev.end and span.end <= len(doc.text) and span.start < span.end
        prev = span


def test_two_column_pdf_reads_column_by_column_with_table_rows_and_no_furniture():
    """A two-column PDF: paragraphs in order (left column before right), the ruled table as rows,
    the running head and "Page N" footer gone, every page in the map with its box."""
    paragraphs = sample_paragraphs(40)
    rendered = render_pdf(paragraphs, [SAMPLE_TABLE], columns=2)
    doc = convert(rendered.data, "filing.pdf")
    assert_in_order(doc, paragraphs)
    assert_rows(doc, SAMPLE_TABLE)
    assert HEADER not in doc.text and f"{FOOTER_PREFIX} 1" not in doc.text
    assert_page_map(doc)
    assert [p.page for p in doc.pages] == list(range(1, rendered.pages + 1))
    assert all(p.box is not None and p.box[2] > 500 for p in doc.pages)


def test_long_pdf_maps_each_paragraph_to_its_page():
    """A 500-page PDF, two paragraphs a page: paragraph i's span is on page i // 2 + 1."""
    paragraphs = sample_paragraphs(1000)
    rendered = render_pdf(paragraphs, page_break_every=2)
    assert rendered.pages == 500
    doc = convert(rendered.data, "long.pdf")
    assert len(doc.pages) == 500
    at = 0
    for i in (0, 1, 2, 501, 998, 999):
        start = doc.text.find(paragraphs[i].split()[0] + " " + paragraphs[i].split()[1] + " ", at)
        assert doc.pages_of(start, start + 10) == [i // 2 + 1]


def test_rotated_page_keeps_its_reading_order():
    """A page with /Rotate 90 comes out top line first, like the unrotated pages, and says its rotation."""
    paragraphs = sample_paragraphs(30)
    rendered = render_pdf(paragraphs, rotated_pages=(1,), page_break_every=10)
    doc = convert(rendered.data, "rotated.pdf")
    assert_in_order(doc, paragraphs)
    assert [p.rotation for p in doc.pages] == [90, 0, 0]


@pytest.mark.parametrize("rotated", [(3,), (1, 3)])
def test_tables_on_a_rotated_page_come_out_as_rows(rotated):
    """Ruled tables on a page with /Rotate 90 are rows with their cells separated, as on upright pages,
    whichever page first needs the table finder."""
    paragraphs = sample_paragraphs(9)
    second = [["Item", "Qty"], ["Bolts", "120"], ["Nuts", "75"]]
    rendered = render_pdf(paragraphs, [SAMPLE_TABLE, second], rotated_pages=rotated, page_break_every=4)
    doc = convert(rendered.data, "rotated-table.pdf")
    assert [p.rotation for p in doc.pages] == [90 if p in rotated else 0 for p in range(1, rendered.pages + 1)]
    last = doc.pages[-1]
    assert "North | 48,250 | 1,200" in doc.text[last.start:last.end]  # the tables are on the rotated page 3
    assert_in_order(doc, paragraphs)
    assert_rows(doc, SAMPLE_TABLE)
    assert_rows(doc, second)


def test_html_keeps_the_article_and_drops_the_boilerplate():
    """An article page: the paragraphs and table rows in order; navigation, cookie banner, sidebar and footer gone."""
    paragraphs = sample_paragraphs(6)
    doc = convert(render_html(paragraphs, [SAMPLE_TABLE]).data, "page.html")
    assert_in_order(doc, paragraphs)
    assert_rows(doc, SAMPLE_TABLE)
    for boilerplate in ("cookies", "Section 3 menu", "Copyright", "Related links", "Privacy policy"):
        assert boilerplate not in doc.text
    assert doc.pages == (PageSpan(1, 0, len(doc.text)),)


def test_docx_body_in_order_with_table_rows_and_page_breaks():
    """A DOCX: paragraphs then the table as rows, the section header left out, the explicit page break a new page."""
    paragraphs = sample_paragraphs(5)
    doc = convert(render_docx(paragraphs, [SAMPLE_TABLE], page_break_after=2).data, "report.docx")
    offsets = assert_in_order(doc, paragraphs)
    assert_rows(doc, SAMPLE_TABLE)
    assert HEADER not in doc.text
    assert [p.page for p in doc.pages] == [1, 2]
    third = doc.text.find(paragraphs[2][:30])
    assert doc.pages_of(0, 10) == [1] and doc.pages_of(third, third + 5) == [2] and offsets


def test_text_files_decode_and_form_feeds_make_pages():
    """A Latin-1 text file decodes; a form feed starts page 2."""
    doc = convert("Größe: 12 Stück\n\fSeite zwei".encode("latin-1"), "notes.txt")
    assert doc.text == "Größe: 12 Stück\n\nSeite zwei"
    assert [(p.page, doc.text[p.start:p.end]) for p in doc.pages] == [(1, "Größe: 12 Stück"), (2, "Seite zwei")]


@pytest.mark.parametrize("name, data, kind, reason", [
    ("scan.pdf", render_scanned_pdf(), "no_text_layer", "no text layer: scanned PDF, OCR is not built in"),
    ("locked.pdf", render_encrypted_pdf(), "encrypted", "encrypted: the PDF needs a password"),
    ("blank.pdf", render_blank_pdf(), "empty", "empty: no text on any of the 1 page"),
    ("broken.pdf", b"%PDF-1.7\n1 0 obj garbage", "corrupt", "corrupt: not a readable PDF"),
    ("zero.pdf", b"", "empty", "empty: the file has no bytes"),
    ("broken.docx", b"PK\x03\x04 not a zip", "corrupt", "corrupt: not a readable DOCX"),
    ("locked.docx", b"\xd0\xcf\x11\xe0" + b"\0" * 100, "encrypted", "encrypted: the DOCX is password-protected"),
    ("nav.html", b"<html><body><nav></nav></body></html>", "empty", "empty: no main text"),
    ("binary.txt", b"ab\x00cd", "corrupt", "corrupt: binary data"),
    ("image.png", b"\x89PNG", "unsupported", "unsupported: .png is not one of"),
])
def test_bad_files_raise_a_typed_error_with_the_reason(name, data, kind, reason):
    """Each kind of bad file raises DocumentError with its kind and a reason starting as documented."""
    with pytest.raises(DocumentError) as err:
        convert(data, name)
    assert err.value.kind == kind and str(err.value).startswith(reason)


def test_oversized_files_and_page_counts_are_refused():
    """A file over max_bytes, or a PDF over max_pages, is an oversized error naming the limit."""
    pdf = render_pdf(sample_paragraphs(6), page_break_every=2).data
    with pytest.raises(DocumentError, match="oversized: 3 pages, more than the limit of 2"):
        convert(pdf, "a.pdf", DocumentLimits(max_pages=2))
    with pytest.raises(DocumentError, match=r"oversized: \d+ bytes, more than the limit of 100"):
        convert(pdf, "a.pdf", DocumentLimits(max_bytes=100))


def test_pages_of_maps_spans_across_pages_and_separators():
    """A span inside a page, across two pages, empty, or in the separator maps to the pages it touches."""
    pages = (PageSpan(1, 0, 10), PageSpan(2, 12, 20), PageSpan(4, 22, 30))
    assert pages_of(pages, 2, 5) == [1]
    assert pages_of(pages, 5, 15) == [1, 2]
    assert pages_of(pages, 0, 30) == [1, 2, 4]
    assert pages_of(pages, 10, 10) == [1]  # empty, at page 1's end
    assert pages_of(pages, 10, 12) == [1]  # only the separator
    assert pages_of(pages, 22, 22) == [4]
    assert pages_of((), 0, 3) == []


def test_converter_version_is_stable_and_short():
    """The version key is a 16-hex string, the same on every call."""
    assert converter_version() == converter_version() and len(converter_version()) == 16


# -- generated content, rendered and converted back ---------------------------------------------

_WORD = st.text(alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"),
                min_size=1, max_size=10)
_PUNCT = st.sampled_from(["", ",", ".", ";", ":", "%", "(x)", "-", "$", "'s"])
_PARAGRAPH = st.lists(st.tuples(_WORD, _PUNCT).map("".join), min_size=3, max_size=60).map(" ".join)
_CELL = st.lists(_WORD, min_size=1, max_size=3).map(" ".join)
_TABLE = st.integers(2, 5).flatmap(lambda cols: st.lists(st.lists(_CELL, min_size=cols, max_size=cols),
                                                         min_size=2, max_size=8))
_CONTENT = st.tuples(st.lists(_PARAGRAPH, min_size=1, max_size=25, unique=True), st.lists(_TABLE, max_size=2))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=_CONTENT, columns=st.sampled_from([1, 2]), break_every=st.sampled_from([0, 3, 7]),
       rotated=st.sampled_from([(), (1,), (1, 2, 3, 4, 5, 6, 7, 8, 9)]))
def test_generated_pdf_content_comes_back_in_order_with_its_rows(content, columns, break_every, rotated):
    """Whatever the paragraphs and ruled tables, one or two columns, any page breaks, upright or /Rotate 90
    pages: the PDF's text holds the paragraphs in order and every table row as a line, rows in order."""
    paragraphs, tables = content
    rendered = render_pdf(paragraphs, tables, columns=columns, page_break_every=break_every)
    rotated = tuple(p for p in rotated if p <= rendered.pages)
    if rotated:
        rendered = render_pdf(paragraphs, tables, columns=columns, page_break_every=break_every, rotated_pages=rotated)
    doc = convert(rendered.data, "gen.pdf")
    assert_in_order(doc, paragraphs)
    for table in tables:
        assert_rows(doc, table)
    assert_page_map(doc)


@settings(max_examples=25, deadline=None)
@given(content=_CONTENT, fmt=st.sampled_from(["docx", "html"]))
@example(content=(["ab cd ef"], [[["x", "y"], ["1", "2"]]]), fmt="html")  # under trafilatura's 250-char fallback
@example(content=(["Short one."], [[["Region", "Rev"], ["N", "4"], ["S", "5"]]]), fmt="html")
def test_generated_docx_and_html_content_comes_back_in_order_with_its_rows(content, fmt):
    """The same for DOCX (document model) and HTML (main-content extraction)."""
    paragraphs, tables = content
    render = render_docx if fmt == "docx" else render_html
    doc = convert(render(paragraphs, tables).data, f"gen.{fmt}")
    assert_in_order(doc, paragraphs)
    for table in tables:
        assert_rows(doc, table)
    assert_page_map(doc)


# -- pages of evidence spans --------------------------------------------------------------------


def test_evidence_pages_names_every_span_of_a_result_row_with_its_pages():
    """Steps, answer spans, field evidence, record evidence and the answer's evidence each get the
    pages their chars lie on; a row without a page map gets none."""
    from memagent.documents.evidence_pages import evidence_pages

    pages = [PageSpan(1, 0, 100), PageSpan(2, 102, 200), PageSpan(3, 202, 300)]
    record = {
        "steps": [{"step": 1, "kind": "memory", "char_start": 0, "char_end": 150},
                  {"step": 2, "kind": "memory", "char_start": 150, "char_end": 300},
                  {"step": 3, "kind": "answer", "char_start": None, "char_end": None}],
        "answer_spans": [{"char_start": 210, "char_end": 215}],
        "evidence_char_start": 150, "evidence_char_end": 300,
        "field_evidence": [{"field": "total", "value": "5", "step": 1, "char_start": 40, "char_end": 42}],
        "records_invoice": [{"record_index": 0, "record_evidence": [{"field": "n", "char_start": 120, "char_end": 125}],
                             "record_conflicts": []}],
        "context": "x" * 300, "pages": [{"char_start": 0, "char_end": 9}],  # not evidence: never walked
    }
    got = {e["span"]: e["pages"] for e in evidence_pages(record, pages)}
    assert got == {"evidence": [2, 3], "steps[0]": [1, 2], "steps[1]": [2, 3], "answer_spans[0]": [3],
                   "field_evidence[0]": [1], "records_invoice[0].record_evidence[0]": [2]}
    assert evidence_pages(record, []) is None


def test_page_labels_and_report_snippets_say_their_pages():
    """A report snippet of a converted document names its page ("p. 2"), a span across pages its range."""
    from memagent.documents.columns import page_rows
    from memagent.documents.evidence_pages import page_label
    from memagent.report.html import add_page_labels

    assert [page_label(p) for p in ([14], [14, 15], [3, 7], [], None)] == ["p. 14", "pp. 14-15", "pp. 3, 7", "", ""]
    view = {"sn": [["evidence", 100, "y" * 50, [[5, 10, "pred"]]], ["gold answer", 0, "z" * 50, [[0, 3, "gold"]]]],
            "xs": [["total", 90, "w" * 40, [[0, 20, "fld"]]]]}
    add_page_labels(view, page_rows([PageSpan(1, 0, 100), PageSpan(2, 102, 200)]))
    assert [s[4] for s in view["sn"]] == ["p. 2", "p. 1"] and view["xs"][0][4] == "pp. 1-2"
    plain = {"sn": [["evidence", 0, "y", [[0, 1, "pred"]]]]}
    add_page_labels(plain, None)
    assert len(plain["sn"][0]) == 4


@pytest.mark.parametrize("path, pattern, matched", [
    ("a.pdf", "*.pdf", True), ("sub/a.pdf", "*.pdf", False), ("sub/a.pdf", "**/*.pdf", True),
    ("a.pdf", "**/*.pdf", True), ("x/y/z/a.pdf", "**/*.pdf", True), ("x/y/a.pdf", "x/**", True),
    ("x/y/a.docx", "x/*/a.doc?", True), ("x/a.pdf", "x/*/a.pdf", False), ("2024/q1.pdf", "202[34]/q?.pdf", True),
])
def test_glob_inputs_match_name_by_name(path, pattern, matched):
    """A documents glob: * and ? stay within a name, ** spans any number of directories, none included."""
    from pipelines.documents_input import _matches

    assert _matches(path, pattern) is matched


def test_holds_parquet_looks_down_to_the_first_level_with_files(tmp_path):
    """A folder is a Parquet input when the first level holding files (names under _ or . aside) holds a
    .parquet file: partitioned Parquet is, a documents lake is, whatever lies deeper."""
    from pipelines.documents_input import _holds_parquet

    import pyarrow.fs as pafs

    fs = pafs.LocalFileSystem()
    for rel in ("parts/year=2024/part-0.parquet", "parts/_SUCCESS", "lake/a.pdf", "lake/deep/x.parquet",
                "nested/_tmp/b.parquet", "nested/docs/2024/q1.docx"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    assert _holds_parquet(fs, str(tmp_path / "parts"))
    assert not _holds_parquet(fs, str(tmp_path / "lake"))
    assert not _holds_parquet(fs, str(tmp_path / "nested"))
    assert not _holds_parquet(fs, str(tmp_path / "empty"))


def test_path_filter_keeps_matching_files_that_are_not_done():
    """The listing's filter drops _ and . names, files the glob does not match and done ids; ``listed`` is
    the same test without the done ids."""
    from pipelines.documents_input import PathFilter

    keep = PathFilter("/lake", "**/*.pdf", {"a/done.pdf"})
    paths = ["/lake/a/done.pdf", "/lake/a/new.pdf", "/lake/b.pdf", "/lake/c.txt", "/lake/_x/d.pdf", "/lake/.e.pdf"]
    assert [p for p in paths if keep.accepts(p)] == ["/lake/a/new.pdf", "/lake/b.pdf"]
    assert [p for p in paths if keep.listed(p)] == ["/lake/a/done.pdf", "/lake/a/new.pdf", "/lake/b.pdf"]
    assert [p for p in ["/lake/c.txt", "/lake/_SUCCESS"] if PathFilter("/lake", None).accepts(p)] == ["/lake/c.txt"]


def test_document_limits_flags_reach_the_batch_config():
    """--max-document-bytes and --max-pdf-pages (derived from DocumentLimits' fields) set the job's limits;
    a bad value is refused in flag names; unset, the config's defaults hold."""
    from memagent_cli.job_cmds import batch_config
    from memagent_cli.main import build_parser

    parse = build_parser().parse_args
    cfg = batch_config(parse(["batch", "--input", "lake", "--output", "o", "--question", "q?",
                              "--max-document-bytes", "4K", "--max-pdf-pages", "12"]))
    assert cfg.document_limits == DocumentLimits(max_bytes=4096, max_pages=12)
    assert batch_config(parse(["batch", "--input", "lake", "--output", "o"])).document_limits == DocumentLimits()
    with pytest.raises(ValueError, match="--max-pdf-pages: Input should be greater than 0"):
        batch_config(parse(["batch", "--input", "lake", "--output", "o", "--max-pdf-pages", "0"]))
