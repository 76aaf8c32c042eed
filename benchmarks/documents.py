"""Documents in: which library converts each format, measured; memory over a long PDF; conversion's share.

    python -m benchmarks.documents --out benchmarks/results/documents.json [--extraction]

1. **PDF readers** (pypdf, pypdfium2, pdfplumber, and memagent's converter: pypdfium2 + pdfplumber's
   table finder on ruled pages) on PDFs rendered from known content (memagent_testing/document_files.py): a
   500-page text file (speed), a two-column file with a ruled table (fidelity). Per reader: pages/s
   on one core (one process, one thread), ``order`` (share of paragraphs found whole and in order,
   whitespace aside), ``rows_one_line`` (share of table rows whose cells are on one line, in order),
   ``rows_delimited`` (... with the cells separated by " | ", telling cells from the words in them).
2. **HTML** (trafilatura main content vs lxml's text of the whole page): docs/s and whether the
   boilerplate (navigation, cookie banner, sidebar, footer) is left out. **DOCX** and **text**: docs/s.
3. **Memory**: peak RSS of a fresh process converting a 50-, 200- and 500-page PDF (flat: the text
   itself is the only part that grows).
4. ``--extraction``: conversion's share of an extraction run: a folder of 4 documents (PDF, HTML, DOCX,
   Markdown) through ``run_batch_qa`` with the packaged model, tiny preset, docs/schemas/contract.json;
   conversion seconds (in-process, same files) against the rows' read seconds.

Headline: ``pdf_pages_per_s`` (memagent's converter, one core).
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import loadavg, machine, print_table, write_json
from memagent.documents import convert
from memagent.documents.layout import table_row
from memagent_testing.document_files import (
    SAMPLE_TABLE, render_docx, render_html, render_pdf, sample_lake, sample_paragraphs,
)


def _flat(text: str) -> str:
    return " ".join(text.split())


def order_share(text: str, paragraphs: list[str]) -> float:
    flat, at, found = _flat(text), 0, 0
    for p in paragraphs:
        i = flat.find(_flat(p), at)
        if i >= 0:
            found, at = found + 1, i + len(_flat(p))
    return found / len(paragraphs)


def row_shares(text: str, table: list[list[str]]) -> tuple[float, float]:
    lines = [_flat(line) for line in text.split("\n")]
    one_line = sum(any(re.search(r"\s*(\|\s*)?".join(map(re.escape, row)), line) for line in lines) for row in table)
    delimited = sum(_flat(table_row(row)) in lines for row in table)
    return one_line / len(table), delimited / len(table)


def read_pypdf(data: bytes) -> str:
    import pypdf

    return "\n".join(p.extract_text() for p in pypdf.PdfReader(io.BytesIO(data)).pages)


def read_pdfium(data: bytes) -> str:
    import pypdfium2 as pdfium

    doc, out = pdfium.PdfDocument(data), []
    for page in doc:
        tp = page.get_textpage()
        out.append(tp.get_text_range().replace("\r\n", "\n"))
        tp.close()
        page.close()
    doc.close()
    return "\n".join(out)


def read_pdfplumber(data: bytes) -> str:
    import pdfplumber

    with pdfplumber.open(io.BytesIO(data)) as pdf:
        return "\n".join(p.extract_text() or "" for p in pdf.pages)


READERS = {"pypdf": read_pypdf, "pypdfium2": read_pdfium, "pdfplumber": read_pdfplumber,
           "memagent": lambda data: convert(data, "x.pdf").text}


def per_second(fn, data: bytes, units: int, min_s: float = 1.0) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        fn(data)
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_s:
            return n * units / dt


def pdf_readers() -> list[dict]:
    paragraphs = sample_paragraphs(40)
    two_col = render_pdf(paragraphs, [SAMPLE_TABLE], columns=2)
    long = render_pdf(sample_paragraphs(1500), page_break_every=3)
    rates: dict[str, list[float]] = {name: [] for name in READERS}
    for _ in range(3):  # interleaved rounds on a shared machine; the median of each
        for name, fn in READERS.items():
            rates[name].append(per_second(fn, long.data, long.pages))
    rows = []
    for name, fn in READERS.items():
        text = fn(two_col.data)
        one_line, delimited = row_shares(text, SAMPLE_TABLE)
        rows.append({"reader": name, "pages_per_s": sorted(rates[name])[1], "rounds": rates[name],
                     "order": order_share(text, paragraphs), "rows_one_line": one_line, "rows_delimited": delimited})
    return rows


def other_formats() -> list[dict]:
    from lxml import html as lxml_html

    paragraphs = sample_paragraphs(20)
    page = render_html(paragraphs, [SAMPLE_TABLE]).data
    docx = render_docx(paragraphs, [SAMPLE_TABLE]).data
    text = "\n\n".join(paragraphs).encode()
    boiler = ("cookies", "Section 3 menu", "Copyright", "Related links")

    def strip_tags(data: bytes) -> str:
        return lxml_html.fromstring(data).text_content()

    out = []
    for fmt, name, fn, data in [("html", "trafilatura (memagent)", lambda d: convert(d, "x.html").text, page),
                                ("html", "lxml text_content (tag stripping)", strip_tags, page),
                                ("docx", "python-docx (memagent)", lambda d: convert(d, "x.docx").text, docx),
                                ("text", "memagent", lambda d: convert(d, "x.txt").text, text)]:
        got = fn(data)
        out.append({"format": fmt, "converter": name, "docs_per_s": per_second(fn, data, 1),
                    "order": order_share(got, paragraphs),
                    "boilerplate_left": sum(b in got for b in boiler) if fmt == "html" else None})
    return out


_RSS_CHILD = """
import sys
from pathlib import Path
from memagent.documents import convert
import memagent.documents.pdf_text, pdfplumber
def kb(key):
    return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1])
data = Path(sys.argv[1]).read_bytes()
before = kb('VmRSS:')
doc = convert(data, 'long.pdf')
print(before, kb('VmHWM:'), len(doc.pages), len(doc.text))
"""


def memory() -> list[dict]:
    """A fresh process per page count (the libraries imported, the file's bytes read): its RSS before
    converting and its peak after (VmHWM), with a ruled table on every page (the table finder runs on each)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for pages in (50, 200, 500):
            path = Path(tmp) / f"{pages}.pdf"
            paragraphs = sample_paragraphs(2 * pages)
            path.write_bytes(render_pdf(paragraphs, [SAMPLE_TABLE] * pages, page_break_every=2).data)
            res = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path)], capture_output=True, text=True,
                                 check=True, cwd=Path(__file__).resolve().parents[1])
            before, peak, n, chars = map(int, res.stdout.split())
            out.append({"pages": n, "file_mb": path.stat().st_size / 2**20, "text_chars": chars,
                        "rss_mb_before": before / 1024, "peak_rss_mb": peak / 1024,
                        "conversion_mb": (peak - before) / 1024})
    return out


def extraction_share() -> dict:
    """Conversion seconds vs the rows' read seconds of a real extraction run over the same 4 files."""
    import pyarrow.dataset as pads

    from memagent.config import AgentConfig
    from memagent.engines import EngineConfig
    from memagent.extraction import load_schema
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig

    files = {"a.pdf": render_pdf(sample_paragraphs(12), [SAMPLE_TABLE], page_break_every=4).data,
             "b.html": render_html(sample_paragraphs(4), [SAMPLE_TABLE]).data,
             "c.docx": render_docx(sample_paragraphs(4), [SAMPLE_TABLE]).data,
             "d.md": "\n\n".join(sample_paragraphs(4)).encode()}
    t0 = time.perf_counter()
    for name, data in files.items():
        convert(data, name)
    convert_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / "lake" / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / "lake" / name).write_bytes(data)
        schema = load_schema(str(Path(__file__).resolve().parents[1] / "docs" / "schemas" / "contract.json"))
        cfg = BatchQAConfig(input=f"{tmp}/lake", output=f"{tmp}/out", engine=EngineConfig(model="smollm2-135m"),
                            agent=AgentConfig(preset="tiny", extraction=schema), job=JobConfig(progress=False))
        t1 = time.perf_counter()
        run_batch_qa(cfg)
        job_s = time.perf_counter() - t1
        rows = pads.dataset(f"{tmp}/out", format="parquet", ignore_prefixes=["_", "."]).to_table(
            columns=["seconds", "error"]).to_pylist()
    read_s = sum(r["seconds"] or 0 for r in rows)
    return {"docs": len(files), "convert_s": convert_s, "rows_read_s": read_s, "job_wall_s": job_s,
            "conversion_share_of_read": convert_s / (convert_s + read_s),
            "errors": [r["error"] for r in rows if r["error"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/documents.json")
    ap.add_argument("--extraction", action="store_true", help="also run the extraction share (packaged model)")
    ap.add_argument("--write-lake", metavar="DIR", help="only write the sample mixed folder (memagent_testing."
                    "document_files.sample_lake: PDF, HTML, DOCX, text, a corrupt and an encrypted file) to DIR")
    args = ap.parse_args()
    if args.write_lake:
        for name, data in sample_lake().items():
            (Path(args.write_lake) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(args.write_lake) / name).write_bytes(data)
        print(f"wrote {len(sample_lake())} files to {args.write_lake}")
        return
    load = [loadavg()]
    pdf = pdf_readers()
    others = other_formats()
    mem = memory()
    share = extraction_share() if args.extraction else None
    load.append(loadavg())
    print_table(["reader", "pages/s", "order", "rows one line", "rows delimited"],
                [[r["reader"], f"{r['pages_per_s']:.0f}", f"{r['order']:.2f}", f"{r['rows_one_line']:.2f}",
                  f"{r['rows_delimited']:.2f}"] for r in pdf])
    print_table(["format", "converter", "docs/s", "order", "boilerplate left"],
                [[r["format"], r["converter"], f"{r['docs_per_s']:.0f}", f"{r['order']:.2f}", r["boilerplate_left"]]
                 for r in others])
    print_table(["pages", "file MB", "RSS MB before", "peak MB", "conversion MB"],
                [[m["pages"], f"{m['file_mb']:.1f}", f"{m['rss_mb_before']:.0f}", f"{m['peak_rss_mb']:.0f}",
                  f"{m['conversion_mb']:.1f}"] for m in mem])
    if share:
        print(f"extraction share: convert {share['convert_s']:.2f} s of {share['convert_s'] + share['rows_read_s']:.1f} s "
              f"({100 * share['conversion_share_of_read']:.2f}%)")
    headline = next(r["pages_per_s"] for r in pdf if r["reader"] == "memagent")
    write_json(args.out, {"pdf_pages_per_s": headline, "pdf_readers": pdf, "other_formats": others, "memory": mem,
                          "extraction_share": share, "load": load, "machine": machine()})


if __name__ == "__main__":
    main()
