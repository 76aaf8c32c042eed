"""The two conversations of MemAgent and their templates (the answer in their replies: :mod:`memagent.replies`).

Memory update (one per chunk): instruction, question, previous memory, section -> new memory.
Final answer (once): instruction, question, memory -> answer, in one of three styles.
Static text comes first and the changing parts last, so an engine with prefix caching reuses
the instruction and question across every call of a job (the hf engine's prefix cache, vLLM's);
:func:`reuse_problems` names a custom template that puts them after the memory or the chunk
(:func:`load_prompts` logs it: the template still works, only its reuse is lost).

The templates are configuration (:class:`PromptTemplates`, ``AgentConfig.prompts``), loadable
from a TOML file with :func:`load_prompts`. Placeholders, ``{name}`` in ``str.format`` syntax
(write a literal brace as ``{{`` or ``}}``):

=================== ===================================== ==========================================
template            required                              optional
=================== ===================================== ==========================================
memory_update       {question} {memory} {chunk}           {instruction}
memory_update_heads {question} {memory} {chunk} {head}    {instruction} {heads}
final_answer        {question} {memory}                   {instruction} {answer_instruction}
full_context        {question} {document}                 {instruction} {answer_instruction}
=================== ===================================== ==========================================

``{instruction}`` becomes ``"Task: <AgentConfig.instruction>\n"`` (empty when none is set; a
set instruction with a template lacking the placeholder is an error, never silently dropped).
``{answer_instruction}`` becomes the sentence asking for ``AgentConfig.answer_style``'s format
(:data:`ANSWER_INSTRUCTIONS`); a template may leave it out and state its own format instead
(as the paper's do), in which case ``answer_style`` should name the format it asks for, since
the answer is extracted by that style.
"""

from __future__ import annotations

import functools
import logging
import re
import string
import tomllib
from os import PathLike
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

# The answer in a reply, public here since before it had its own module (the serve app, extraction and the
# tests import it from here); the conversations below ask for it in one of these styles.
from memagent.replies import (  # noqa: F401
    AnswerStyle,
    extract_answer,
    extract_boxed_answer,
    extract_phrase_answer,
    last_boxed,
    parse_json_answer,
    strip_thinking,
)

NO_MEMORY = "No previous memory"

Messages = list[dict[str, str]]


def _tagged(tag: str, placeholder: str) -> str:
    """One input of a prompt, in its tags, then a blank line: ``<tag>\n{placeholder}\n</tag>\n\n``."""
    return f"<{tag}>\n{{{placeholder}}}\n</{tag}>\n\n"


# The built-in templates are written from these parts, so the agent's prompts share their wording and their
# inputs' order (instruction and question before memory and chunk: the order prefix caching reuses).
_READING = ("You are reading a long document one section at a time, with a question to answer at the end.\n"
            "You keep a short memory of everything in the document that could help answer the question.\n")
_REWRITE = "add any new facts from this section that help answer the question"
_PROBLEM, _MEMORY = _tagged("problem", "question"), _tagged("memory", "memory")
_SECTION, _DOCUMENT = _tagged("section", "chunk"), _tagged("document", "document")
_ANSWER = "{answer_instruction}\n\nYour answer:"

MEMORY_UPDATE_TEMPLATE = (
    _READING
    + "Below are the question, your memory so far, and the next section of the document.\n"
    f"Rewrite the memory: keep every relevant detail it already holds, and {_REWRITE}.\n"
    "Write only the updated memory.\n"
    "{instruction}\n" + _PROBLEM + _MEMORY + _SECTION + "Updated memory:"
)

# A memory of K heads (AgentConfig.memory_heads > 1, memagent.heads): the model sees every head and rewrites one.
MEMORY_HEADS_TEMPLATE = (
    _READING
    + "Your memory is split into {heads} labelled heads. At each section you rewrite exactly one head; "
    "the others are kept as they are.\n"
    "Below are the question, your whole memory, and the next section of the document.\n"
    f"Rewrite head {{head}}: keep every relevant detail it already holds, and {_REWRITE} "
    "(facts another head holds need not be repeated).\n"
    "Write only the new text of head {head}, without its label.\n"
    "{instruction}\n" + _PROBLEM + _MEMORY + _SECTION + "New text of head {head}:"
)

FINAL_ANSWER_TEMPLATE = (
    "You have read a long document and kept a memory of what matters for the question.\n"
    "Answer the question using only the memory below.\n"
    "{instruction}\n" + _PROBLEM + _MEMORY + _ANSWER
)

# The full-context baseline: the same question and answer format, the whole document in one prompt.
FULL_CONTEXT_TEMPLATE = (
    "Read the document below and answer the question about it.\n"
    "{instruction}\n" + _DOCUMENT + _PROBLEM + _ANSWER
)

# What ``{answer_instruction}`` becomes for each answer style (inserted as a value: braces are literal).
ANSWER_INSTRUCTIONS: dict[str, str] = {
    "boxed": "Put your final answer inside \\boxed{}.",
    "phrase": 'End your reply with "Therefore, the answer is (your answer)".',
    "json": "Reply with a single JSON value and nothing else.",
}

# Template name -> (required placeholders, optional placeholders).
PLACEHOLDERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "memory_update": (frozenset({"question", "memory", "chunk"}), frozenset({"instruction"})),
    "memory_update_heads": (frozenset({"question", "memory", "chunk", "head"}), frozenset({"instruction", "heads"})),
    "final_answer": (frozenset({"question", "memory"}), frozenset({"instruction", "answer_instruction"})),
    "full_context": (frozenset({"question", "document"}), frozenset({"instruction", "answer_instruction"})),
}
REQUIRED_KEYS = ("memory_update", "final_answer")  # keys a prompts file must have; the others are optional

log = logging.getLogger(__name__)

# For prefix reuse: the placeholders whose text every call of a job shares, and those whose text changes
# from call to call. The agent's templates (not full_context, the one-call baseline) should hold the first
# before the second. ({answer_instruction}, the format sentence, stays next to the answer in final_answer:
# one call per document, a sentence or two recomputed.)
SHARED_PLACEHOLDERS = ("instruction", "question")
CHANGING_PLACEHOLDERS = ("memory", "chunk")


def _braced(names: frozenset[str]) -> str:
    return " ".join(f"{{{n}}}" for n in sorted(names))


@functools.lru_cache(maxsize=256)
def template_fields(template: str) -> frozenset[str]:
    """The placeholder names in ``template``; raises ``ValueError`` on a malformed one.

    >>> sorted(template_fields("{question} \\\\boxed{{}} {memory}"))
    ['memory', 'question']
    """
    names = set()
    for _, name, spec, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise ValueError(
                f"has a positional placeholder {{{name}}}: name it, or write a literal brace as {{{{ or }}}}"
            )
        if spec or conversion:
            raise ValueError(f"has a format spec or conversion in {{{name}}}: write the placeholder as a bare name")
        names.add(name)
    return frozenset(names)


def check_template(name: str, template: str) -> str:
    """Validate one template's placeholders; ``ValueError`` naming the template and placeholder.

    Returns the template unchanged.
    """
    if name not in PLACEHOLDERS:
        raise ValueError(f"unknown template {name!r}; the templates are {', '.join(PLACEHOLDERS)}")
    required, optional = PLACEHOLDERS[name]
    try:
        found = template_fields(template)
    except ValueError as e:  # ours ("has ...") or str.format's own ("Single '}' encountered ...")
        why = str(e) if str(e).startswith("has ") else f"is malformed ({e}); write a literal brace as {{{{ or }}}}"
        raise ValueError(f"template {name!r} {why}") from None
    unknown = sorted(found - required - optional)
    if unknown:
        raise ValueError(f"template {name!r} has an unknown placeholder {{{unknown[0]}}}; "
                         f"allowed: {_braced(required | optional)} (write a literal brace as {{{{ or }}}})")
    missing = sorted(required - found)
    if missing:
        raise ValueError(f"template {name!r} is missing the placeholder {{{missing[0]}}}; "
                         f"it needs {_braced(required)}")
    return template


class PromptTemplates(BaseModel):
    """The prompt templates the agent and the full-context baseline render (see the module docstring).

    Defaults are the built-in templates. Placeholders are checked on construction: a missing
    required one or an unknown one is a ``ValueError`` naming the template and the placeholder.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_update: str = Field(
        MEMORY_UPDATE_TEMPLATE,
        description="Memory-update prompt, one per chunk: {question} {memory} {chunk}, optional {instruction}.",
    )
    memory_update_heads: str = Field(
        MEMORY_HEADS_TEMPLATE,
        description="Memory-update prompt of a memory of K heads (memory_heads > 1): {question} {memory} {chunk} "
        "{head} (the head to rewrite, 1-based), optional {instruction} {heads} (K).",
    )
    final_answer: str = Field(
        FINAL_ANSWER_TEMPLATE,
        description="Final-answer prompt: {question} {memory}, optional {instruction} {answer_instruction}.",
    )
    full_context: str = Field(
        FULL_CONTEXT_TEMPLATE,
        description="Full-context baseline prompt: {question} {document}, optional {instruction} {answer_instruction}.",
    )

    @field_validator("memory_update", "memory_update_heads", "final_answer", "full_context")
    @classmethod
    def _check_placeholders(cls, template: str, info: ValidationInfo) -> str:
        return check_template(info.field_name or "", template)

    def check_instruction(self, instruction: str | None, names: tuple[str, ...] = REQUIRED_KEYS) -> None:
        """Raise ``ValueError`` when ``instruction`` is set but a named template has no ``{instruction}``."""
        if not instruction:
            return
        for name in names:
            if "instruction" not in template_fields(getattr(self, name)):
                raise ValueError(
                    f"an instruction is set but the {name} template has no {{instruction}} placeholder; "
                    "add one to the template (or write the instruction into it) and drop the instruction"
                )


DEFAULT_PROMPTS = PromptTemplates()


def reuse_problems(prompts: PromptTemplates) -> list[str]:
    """One sentence per agent template that puts a shared placeholder (``{question}``, ``{instruction}``) after a
    changing one (``{memory}``, ``{chunk}``): an engine's prefix cache then recomputes it on every call."""
    out = []
    for name in ("memory_update", "memory_update_heads", "final_answer"):
        order = [f for _, f, _, _ in string.Formatter().parse(getattr(prompts, name)) if f]
        changing = [i for i, f in enumerate(order) if f in CHANGING_PLACEHOLDERS]
        late = [f for f in order[changing[0]:] if f in SHARED_PLACEHOLDERS] if changing else []
        if late:
            out.append(f"template {name!r} puts {{{late[0]}}} after {{{order[changing[0]]}}}: the text from "
                       f"{{{order[changing[0]]}}} on differs per call, so prefix caching cannot reuse {{{late[0]}}}; "
                       "put the instruction and question first for a cheaper read")
    return out


def load_prompts(path: str | PathLike[str]) -> PromptTemplates:
    """Read prompt templates from a TOML file with the keys memory_update, final_answer, full_context.

    ``full_context`` and ``memory_update_heads`` are optional (the built-in ones are used). Every problem (unreadable file, bad
    TOML, unknown or missing key, a value that is not a string, a bad placeholder) is a one-line
    ``ValueError`` naming the file.
    """
    path = Path(path).expanduser()
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"prompts file {path} not found") from None
    except OSError as e:
        raise ValueError(f"prompts file {path} cannot be read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"prompts file {path} is not valid TOML: {e}") from None
    keys = f"the keys are {', '.join(REQUIRED_KEYS)} and (optional) full_context, memory_update_heads"
    for key, value in data.items():
        if key not in PLACEHOLDERS:
            raise ValueError(f"prompts file {path}: unknown key {key!r}; {keys}")
        if not isinstance(value, str):
            raise ValueError(f"prompts file {path}: {key} must be a string, got {type(value).__name__}")
    for key in REQUIRED_KEYS:
        if key not in data:
            raise ValueError(f"prompts file {path}: missing key {key!r}; {keys}")
    try:
        prompts = PromptTemplates(**data)
    except ValidationError as e:  # one line: the first problem, as check_template words it
        raise ValueError(f"prompts file {path}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    for problem in reuse_problems(prompts):
        log.warning("prompts file %s: %s", path, problem)
    return prompts


def _toml_string(text: str) -> str:
    """``text`` as a TOML multi-line basic string that reads back identical."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n" or ch == "\t":
            out.append(ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    body = "".join(out)
    # Spaces at a line's end are escaped so editors that trim trailing whitespace cannot change them.
    body = re.sub(r"[ ]+(?=\n|$)", lambda m: "\\u0020" * len(m.group()), body)
    return '"""\n' + body + '"""'


def prompts_to_toml(prompts: PromptTemplates = DEFAULT_PROMPTS) -> str:
    """The templates as a TOML file :func:`load_prompts` reads back equal (a start for custom prompts)."""
    parts = ["# MemAgent prompt templates; see memagent/prompts.py for the placeholders.\n"]
    for name in PLACEHOLDERS:
        parts.append(f"\n{name} = {_toml_string(getattr(prompts, name))}\n")
    return "".join(parts)


def _instruction_line(instruction: str | None) -> str:
    return f"Task: {instruction.strip()}\n" if instruction else ""


def _render(prompts: PromptTemplates | None, name: str, instruction: str | None, **values: str) -> Messages:
    prompts = prompts or DEFAULT_PROMPTS
    prompts.check_instruction(instruction, (name,))
    content = getattr(prompts, name).format(instruction=_instruction_line(instruction), **values)
    return [{"role": "user", "content": content}]


def memory_update_messages(
    question: str, memory: str, chunk: str, instruction: str | None = None, prompts: PromptTemplates | None = None
) -> Messages:
    """One memory-update conversation as chat messages (a single user turn)."""
    return _render(prompts, "memory_update", instruction, question=question, memory=memory, chunk=chunk)


def memory_heads_messages(
    question: str, memory: str, chunk: str, head: int, heads: int, instruction: str | None = None,
    prompts: PromptTemplates | None = None,
) -> Messages:
    """One step of a memory of ``heads`` heads: rewrite head ``head`` (0-based; the prompt counts from 1)."""
    return _render(prompts, "memory_update_heads", instruction, question=question, memory=memory, chunk=chunk,
                   head=str(head + 1), heads=str(heads))


_CHUNK_MARK = "\x00memagent-chunk\x00"


def records_messages(
    question: str, memory: str, chunk: str, request: str, instruction: str | None = None,
    prompts: PromptTemplates | None = None,
) -> Messages:
    """A per-chunk records call (corpus extraction): the memory-update prompt up to its chunk, then ``request``.

    The prompt is the memory-update conversation's own text through ``{chunk}`` and the rest of
    that paragraph (the default template's ``</section>``), so the records call and the memory
    update of one chunk share their prefix (instruction, question, memory, chunk) and an engine
    with prefix caching computes it once; only the request after it differs.
    """
    content = _render(prompts, "memory_update", instruction, question=question, memory=memory,
                      chunk=_CHUNK_MARK)[0]["content"]
    head, _, tail = content.partition(_CHUNK_MARK)
    close = tail.split("\n\n", 1)[0] if "\n\n" in tail else ""
    return [{"role": "user", "content": f"{head}{chunk}{close}\n\n{request}"}]


def final_answer_messages(question: str, memory: str, style: AnswerStyle, instruction: str | None = None,
                          prompts: PromptTemplates | None = None, answer_instruction: str | None = None) -> Messages:
    """The final-answer conversation: question and memory only, no document text.

    ``answer_instruction`` replaces the style's format sentence (an extraction names its keys).
    """
    return _render(prompts, "final_answer", instruction, question=question, memory=memory,
                   answer_instruction=answer_instruction or ANSWER_INSTRUCTIONS[style])


def full_context_messages(question: str, document: str, style: AnswerStyle, instruction: str | None = None,
                          prompts: PromptTemplates | None = None) -> Messages:
    """The baseline's single conversation: the (possibly truncated) document and the question."""
    return _render(prompts, "full_context", instruction, question=question, document=document,
                   answer_instruction=ANSWER_INSTRUCTIONS[style])
