"""Documents as they come (PDF, HTML, DOCX, text) to text with a page map, for the jobs' ``context``.

:func:`convert` picks the converter by the file name's extension; each keeps reading order,
writes a table row as one line with its cells separated, drops headers and footers repeated on
every page, and returns a :class:`Document` whose page map links every char offset to its page
(for PDFs with the page's box). A bad file raises :class:`DocumentError` naming the reason
(``encrypted``, ``corrupt``, ``empty``, ``no text layer``, ``oversized``, ``unsupported``).
Nothing here downloads anything; OCR is not built in. Library choices and their measurements:
benchmarks/documents.py.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib import metadata
from pathlib import PurePosixPath

from memagent.documents.model import Document, DocumentError, DocumentLimits, PageSpan, pages_of

__all__ = ["CONVERTER_VERSION", "DOCUMENT_SUFFIXES", "Document", "DocumentError", "DocumentLimits", "PageSpan",
           "check_file_size", "convert", "converter_version", "document_format", "pages_of"]

CONVERTER_VERSION = "2"  # bump when a converter's output changes for the same file and libraries
FORMATS = {".pdf": "pdf", ".html": "html", ".htm": "html", ".docx": "docx", ".txt": "text", ".md": "text"}
DOCUMENT_SUFFIXES = tuple(FORMATS)
_LIBRARIES = ("pypdfium2", "pdfplumber", "trafilatura", "python-docx", "charset-normalizer")


def document_format(name: str) -> str | None:
    """The format a file name's extension says ("pdf", "html", "docx", "text"), or None."""
    return FORMATS.get(PurePosixPath(name).suffix.lower())


@lru_cache(maxsize=1)
def converter_version() -> str:
    """This converter's version with the versions of the libraries it converts with: a cache key part
    (the same file converted by another version may come out differently)."""
    parts = [f"memagent-documents={CONVERTER_VERSION}"]
    for lib in _LIBRARIES:
        try:
            parts.append(f"{lib}={metadata.version(lib)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{lib}=none")
    return hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]


def check_file_size(size: int, limits: DocumentLimits) -> None:
    """:class:`DocumentError` ``oversized`` for a file of ``size`` bytes over ``limits.max_bytes`` (checked before
    a file is read, where its size is listed, and by :func:`convert`)."""
    if size > limits.max_bytes:
        raise DocumentError("oversized", f"oversized: {size} bytes, more than the limit of {limits.max_bytes}")


def convert(data: bytes, name: str, limits: DocumentLimits | None = None) -> Document:
    """``data`` (the file named ``name``) converted by its format's converter; :class:`DocumentError`
    for a file that cannot be."""
    limits = limits or DocumentLimits()
    fmt = document_format(name)
    if fmt is None:
        raise DocumentError("unsupported", f"unsupported: {PurePosixPath(name).suffix or 'no extension'} is not "
                            f"one of {', '.join(DOCUMENT_SUFFIXES)}")
    check_file_size(len(data), limits)
    if not data:
        raise DocumentError("empty", "empty: the file has no bytes")
    if fmt == "pdf":
        from memagent.documents.pdf_text import convert_pdf

        return convert_pdf(data, limits)
    if fmt == "html":
        from memagent.documents.html_text import convert_html

        return convert_html(data)
    if fmt == "docx":
        from memagent.documents.docx_text import convert_docx

        return convert_docx(data)
    from memagent.documents.plain_text import convert_text

    return convert_text(data)
