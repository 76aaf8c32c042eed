"""A memory of K heads: K labelled blocks in one text, one block rewritten per step.

    memory = labelled(["No previous memory"] * K)
    for step, chunk in enumerate(chunks):
        h = next_head(step, last_updated(memory))          # least recently updated
        memory = write_head(memory, h, LLM(question, memory, chunk, h), step)   # the other K-1 kept verbatim

The labels carry the step each head was last written at, so the memory text alone is the whole
state: a checkpoint holds it, and a read resumed from it chooses the same heads as the
uninterrupted one. Each block is ``label\\ntext`` and blocks are joined by a blank line; a written
text is cleaned of anything that looks like a label, so :func:`split_heads` reads back exactly the
texts :func:`labelled` joined (carried heads are byte for byte the same). ``K = 1`` is the paper's
single unlabelled memory; the functions a read calls whatever K (:func:`update_request`,
:func:`written_memory`, :func:`records_memory`) keep it as it is.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

from memagent.engines.base import SamplingParams
from memagent.prompts import NO_MEMORY, Messages, memory_heads_messages, memory_update_messages, strip_thinking

if TYPE_CHECKING:
    from memagent.config import AgentConfig

NEVER = -1  # the last-updated step of a head not yet written
_LABEL = re.compile(r"^## Memory head (\d+) of (\d+) \((?:last written at step (\d+)|not yet written)\)$", re.M)


def label(head: int, count: int, written_at: int) -> str:
    """The label line of head ``head`` (0-based) of ``count``."""
    when = "not yet written" if written_at == NEVER else f"last written at step {written_at}"
    return f"## Memory head {head + 1} of {count} ({when})"


def labelled(texts: Sequence[str], written_at: Sequence[int]) -> str:
    """The memory text of K heads: ``texts`` and ``written_at`` both of length K."""
    if len(texts) != len(written_at) or not texts:
        raise ValueError(f"heads: {len(texts)} texts and {len(written_at)} steps; need K >= 1 of each")
    return "\n\n".join(f"{label(h, len(texts), w)}\n{t}" for h, (t, w) in enumerate(zip(texts, written_at)))


def initial_memory(count: int) -> str:
    """The memory before the first step: the paper's single memory for ``count == 1``, else K unwritten heads."""
    return NO_MEMORY if count == 1 else labelled([NO_MEMORY] * count, [NEVER] * count)


def split_heads(memory: str, count: int) -> tuple[list[str], list[int]]:
    """``(texts, written_at)``, each of length ``count``, of a memory :func:`labelled` made.

    Raises ``ValueError`` when ``memory`` is not ``count`` labelled blocks in order (a checkpoint
    of another config, say).
    """
    marks = list(_LABEL.finditer(memory))
    ok = len(marks) == count and marks[0].start() == 0 and all(
        int(m.group(1)) == h + 1 and int(m.group(2)) == count for h, m in enumerate(marks))
    ok = ok and all(memory[m.start() - 2:m.start()] == "\n\n" for m in marks[1:])
    if not ok:
        raise ValueError(f"the memory is not {count} labelled heads (## Memory head i of {count} ...)")
    ends = [m.start() - 2 for m in marks[1:]] + [len(memory)]
    texts = [memory[m.end() + 1:end] for m, end in zip(marks, ends)]
    written = [NEVER if m.group(3) is None else int(m.group(3)) for m in marks]
    return texts, written


def last_updated(memory: str, count: int) -> list[int]:
    """The step each of the ``count`` heads was last written at (:data:`NEVER` for none)."""
    return split_heads(memory, count)[1]


def next_head(step: int, last: Sequence[int]) -> int:
    """The head step ``step`` rewrites: the least recently updated (ties: the lowest index).

    Every step writes exactly one head, so from a fresh memory this is round-robin (``step % K``):
    each head is rewritten exactly once in every K consecutive steps. ``last`` (length K) holds
    steps before ``step``.
    """
    if any(w >= step for w in last):
        raise ValueError(f"step {step}: a head was written at a later step ({list(last)})")
    return min(range(len(last)), key=lambda h: (last[h], h))


def clean_head(text: str) -> str:
    """A written head's text: stripped, label-like lines removed (they would split the memory wrongly)."""
    return _LABEL.sub("", text).strip()


def write_head(memory: str, count: int, head: int, text: str, step: int) -> str:
    """``memory`` with head ``head`` replaced by ``text`` (cleaned) written at ``step``; the others verbatim."""
    texts, written = split_heads(memory, count)
    texts[head], written[head] = clean_head(text), step
    return labelled(texts, written)


def unlabelled(memory: str, count: int) -> str:
    """The heads' texts of ``memory`` joined by blank lines, without their labels: what a records call reads
    and grounds through (a label's numbers and words are no value the document stated)."""
    return "\n\n".join(split_heads(memory, count)[0])


def records_memory(memory: str, count: int) -> str:
    """The memory a records call reads and grounds through: the single memory as it is, K heads
    :func:`unlabelled`."""
    return memory if count == 1 else unlabelled(memory, count)


def update_request(question: str, memory: str, chunk: str, step: int, config: AgentConfig,
                   params: SamplingParams) -> tuple[Messages, SamplingParams, int | None]:
    """Memory update ``step``'s messages and sampling, and the head it rewrites (None: the single memory).

    K heads: the least recently updated head (:func:`next_head`), decoding at most memory_tokens // K tokens."""
    k = config.memory_heads
    if k == 1:
        return memory_update_messages(question, memory, chunk, config.instruction, config.prompts), params, None
    head = next_head(step, last_updated(memory, k))
    messages = memory_heads_messages(question, memory, chunk, head, k, config.instruction, config.prompts)
    return messages, replace(params, max_tokens=config.memory_tokens // k), head


def written_memory(before: str, reply: str, count: int, head: int | None, step: int) -> str:
    """The memory an update's ``reply`` writes over ``before``: the reply itself (thinking dropped, stripped) for
    the single memory (``head`` None); K heads: head ``head`` rewritten at ``step``, the others carried verbatim."""
    text = strip_thinking(reply).strip()
    return text if head is None else write_head(before, count, head, text, step)
