"""Where a records call reads: a chunk's piece and the rest of the sentence its end cuts, and how a piece is halved.

:func:`records_reach` gives a chunk's call its text (the chunk and the rest of the sentence its end cuts) and
the point from which it owns the records (after the sentence its start cuts, which the call before read whole);
:func:`halves` cuts an overflowing piece in two at the break nearest its middle (:func:`split_point`), the first
half reading on to the end of the sentence the cut falls in. Pure text geometry (:mod:`memagent.extraction.reading`
reads the pieces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from memagent.extraction.record_grounding import SENTENCE_END

TAIL_CHARS = 400  # how far a records call reads past its piece to finish a cut sentence


class HasCharSpan(Protocol):
    char_start: int
    char_end: int


def sentence_end(text: str, pos: int, limit: int) -> int:
    """Where the sentence that ``pos`` cuts ends: ``pos`` itself when a sentence or line ends there
    (or at the text's end), else after the first sentence end in ``(pos, min(limit, pos + TAIL_CHARS)]``,
    else ``pos`` (no end near: the cut stays where it is)."""
    if pos <= 0 or pos >= len(text):
        return pos
    m = SENTENCE_END.search(text, pos - 1, min(limit, pos + TAIL_CHARS, len(text)))
    return m.end() if m is not None else pos


def records_reach(text: str, chunks: Sequence[HasCharSpan], k: int) -> tuple[int, int, int]:
    """``(start, owned_from, end)``: chunk ``k``'s records call reads ``text[start:end]`` (the chunk and the
    rest of the sentence its end cuts) and leaves out the records whose values grounded in that text
    all lie before ``owned_from`` (the end of the sentence its start cuts, read whole by the call before).

    Each boundary's sentence end is computed the same way from both sides, and may lie chunks further
    on (a long sentence in small chunks), so the owned parts ``[owned_from, end)`` of consecutive chunks
    tile the text. A boundary where chunks are not contiguous (the middle dropped by ``max_chunks``)
    is not crossed.
    """
    c = chunks[k]
    owned_from = c.char_start
    if k > 0 and chunks[k - 1].char_end == c.char_start:
        owned_from = sentence_end(text, c.char_start, len(text))
    end = c.char_end
    if k + 1 < len(chunks) and chunks[k + 1].char_start == c.char_end:
        end = max(end, sentence_end(text, c.char_end, len(text)))
    return c.char_start, owned_from, end


@dataclass(frozen=True)
class Piece:
    """The text one records call reads, ``context[start:end]``; it owns the records stated from ``owned_from``
    on (:func:`records_reach`) and is ``depth`` splits below its chunk."""

    start: int
    owned_from: int
    end: int
    depth: int = 0


_BREAKS = ("\n\n", "\n", ". ", "。", " ")  # preferred cuts: paragraph, line, sentence, word


def split_point(text: str) -> int:
    """Where to cut ``text`` in two: after the break nearest the middle, paragraphs before lines before
    sentences before words, within the middle half; the middle itself when there is none."""
    mid, lo, hi = len(text) // 2, len(text) // 4, 3 * len(text) // 4
    for sep in _BREAKS:
        best = None
        i = text.find(sep, lo)
        while i != -1 and i + len(sep) <= hi:
            if best is None or abs(i + len(sep) - mid) < abs(best - mid):
                best = i + len(sep)
            i = text.find(sep, i + 1)
        if best is not None and 0 < best < len(text):
            return best
    return mid


def halves(context: str, piece: Piece) -> tuple[Piece, Piece]:
    """A piece cut in two at :func:`split_point`; the first half reads on to the end of the sentence the
    cut falls in (when that leaves it shorter than the piece), which the second half then leaves to it.
    When that sentence runs to the piece's end, the cut moves back to where it begins instead, so that
    the second half holds it whole (cut inside, neither half would read it)."""
    cut = piece.start + split_point(context[piece.start:piece.end])
    reach = sentence_end(context, cut, piece.end + 1)  # + 1: a sentence ending at the piece's end is seen to end
    if reach >= piece.end:
        back = max((m.end() for m in SENTENCE_END.finditer(context, piece.start, cut)), default=piece.start)
        cut = reach = back if piece.start < back < cut else cut
    return (Piece(piece.start, piece.owned_from, reach, piece.depth + 1),
            Piece(cut, max(piece.owned_from, reach), piece.end, piece.depth + 1))
