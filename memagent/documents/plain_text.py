"""Text and Markdown files: decoded (UTF-8, else the encoding charset-normalizer finds); a form
feed starts a new page."""

from __future__ import annotations

from memagent.documents.layout import tidy
from memagent.documents.model import Document, DocumentError, join_pages


def convert_text(data: bytes) -> Document:
    """The file's text with its page map; :class:`DocumentError` for a binary or empty file."""
    text = _decode(data)
    if "\x00" in text:
        raise DocumentError("corrupt", "corrupt: binary data (NUL bytes) in a text file")
    texts = [tidy(page) for page in text.split("\f")]
    if not any(texts):
        raise DocumentError("empty", "empty: the text file has no text")
    joined, spans = join_pages(texts)
    return Document(joined, spans, "text")


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None:
        raise DocumentError("corrupt", "corrupt: not text in any known encoding")
    return str(best)
