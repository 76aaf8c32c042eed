"""The extraction schema: the user's JSON Schema (or Pydantic model) of what to pull out of every document.

:class:`ExtractionSchema` holds the user's schema as given (a pydantic root model, so it sits inside
:class:`memagent.config.AgentConfig` as ``extraction``, is recorded in the output's ``config`` column and in the
resume fingerprint, and reads back equal). On load it is

1. resolved by :func:`memagent.extraction.resolve.resolve`, the one place that decides what a schema means
   (``$ref``/``allOf`` inlined, unions, formats, record types and their parents' keys, what is refused):
   the *derived* schema and the way back to the user's shape (:meth:`ExtractionSchema.assemble`) and
   its check (:meth:`ExtractionSchema.errors`);
2. read into specs by :func:`memagent.extraction.parse.parse_schema`: document-level fields (leaves of one
   kind of :mod:`memagent.extraction.kinds`, objects as structs) and record types (arrays of objects, named
   by their dotted path), with the limits on names and sizes; two values with one dotted name are refused.

Every problem is a one-line ``ValueError`` naming its JSON path, before any model loads. The schema then
says what each call asks and is constrained to: the memory question (:meth:`ExtractionSchema.question`,
:meth:`ExtractionSchema.memory_question`), the final answer in field groups (:meth:`ExtractionSchema.field_groups`)
each bounded to its budget (:meth:`ExtractionSchema.answer_schemas`), the per-chunk records calls
(:meth:`ExtractionSchema.records_schema`). :func:`load_schema` reads a file (with a byte bound) or
``module:Model``; a model's schema names the model (``x-pydantic-model``) so each row is validated with it
too (:mod:`memagent.extraction.model_check`).
"""

from __future__ import annotations

import json
import re
from os import PathLike
from pathlib import Path
from typing import Any, Mapping

from pydantic import PrivateAttr, RootModel, model_validator

from memagent.extraction.answer_bounds import answer_room_tokens, budgeted_json
from memagent.extraction.groups import (
    BRACES_TOKENS, FieldGroup, group_fields, group_schema, grouping_report, reply_tokens,
)
from memagent.extraction.kinds import FieldKind
from memagent.extraction.model_check import load_model, model_named
from memagent.extraction.record_groups import (
    MEMORY_QUESTION_TOKENS, RecordFamily, RecordGroup, compact_name, compact_record_lines, group_instruction,
    group_record_types, record_families,
)
from memagent.extraction.record_groups import group_schema as records_group_schema
from memagent.extraction.parse import (
    MAX_DEPTH, MAX_SCHEMA_CHARS, PROPERTY_KEYWORDS, SUPPORTED, TOP_KEYWORDS, FieldSpec, ObjectSpec, RecordType,
    check_size, clean, iter_leaves, parse_schema,
)
from memagent.extraction.resolve import Resolved, resolve, validator, without_nulls
from memagent.result_schema import EXTRA_OUTPUT_COLUMNS, N_RECORDS_PREFIX, RECORD_COLUMNS, RECORDS_PREFIX, RESULT_COLUMNS

__all__ = ["FieldKind", "FieldSpec", "ObjectSpec", "RecordType", "ExtractionSchema", "load_schema", "schema_from",
           "parse_fields", "PROPERTY_KEYWORDS", "SUPPORTED", "TOP_KEYWORDS", "RECORD_COLUMNS"]

# Input columns a job reads or passes with a meaning (a property may not take their names, nor an output's).
INPUT_COLUMNS = ("id", "question", "context", "answers", "metric")

# Rough budget sizes (tokens) for the up-front checks: what one field takes in the memory (a
# candidate value and where it was seen); a family of record types (one item schema: record_groups), what
# later chunks must carry to read its records (the keys of the records already known, aliases, an open record).
MEMORY_TOKENS_PER_FIELD = 24
MEMORY_TOKENS_PER_RECORD_FAMILY = 48  # per family of record types, not per type: the names are in the question
# Records one records call may return: a reply that fills it is overflow (the piece is split and re-read,
# counted), never taken as complete. A bound keeps a looping reply short.
RECORDS_PER_CALL = 50
# A schema file is read up to this many bytes (JSON text may spend 4 bytes on a character of the schema).
MAX_SCHEMA_FILE_BYTES = 4 * MAX_SCHEMA_CHARS
# The root keyword that names the Pydantic model a schema came from (``module:Model``): each assembled object
# is validated with it too (memagent.extraction.model_check), in every worker, from the recorded config.
MODEL_KEYWORD = "x-pydantic-model"


def _reserved_columns() -> tuple[str, ...]:
    return (*INPUT_COLUMNS, *RESULT_COLUMNS, *EXTRA_OUTPUT_COLUMNS)


def parse_fields(schema: Any) -> tuple[FieldSpec, ...]:
    """The document-level leaves of a JSON Schema, named by their dotted path inside objects (``lender.name``);
    ``ValueError`` naming what is wrong."""
    from dataclasses import replace

    fields = ExtractionSchema(schema).fields
    return tuple(replace(f, name=path) for path, f, _ in iter_leaves(fields, {}))


class ExtractionSchema(RootModel[dict[str, Any]]):
    """A JSON Schema (supported subset, see the module docstring) of what to extract from each document."""

    model_config = {"frozen": True}
    _fields: tuple[FieldSpec | ObjectSpec, ...] = PrivateAttr(default=())
    _records: tuple[RecordType, ...] = PrivateAttr(default=())
    _resolved: Resolved | None = PrivateAttr(default=None)
    _families: tuple[RecordFamily, ...] = PrivateAttr(default=())
    _groups: dict[int, tuple[RecordGroup, ...]] = PrivateAttr(default_factory=dict)  # record_groups per reply budget

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, data: Any) -> Any:
        data = _model_schema(data)
        check_size(data)  # before pydantic walks it: a deeply nested value must not recurse
        return data

    @model_validator(mode="after")
    def _parse(self) -> ExtractionSchema:
        self._resolved = resolve(self.root)
        self._fields, self._records = parse_schema(self._resolved.schema, _reserved_columns(), RECORD_COLUMNS)
        _check_dotted_names(self._fields, self._records)
        self._families = record_families(self.root, self._records)
        columns = {prefix + r.name: (what, r.name) for r in self._records
                   for prefix, what in ((N_RECORDS_PREFIX, "record count"), (RECORDS_PREFIX, "records"))}
        for f in self._fields:
            if f.name in columns:
                what, name = columns[f.name]
                raise ValueError(f"properties.{f.name}: property {f.name!r} clashes with the {what} column "
                                 f"of record type {name!r}; rename it")
        return self

    @property
    def fields(self) -> tuple[FieldSpec | ObjectSpec, ...]:
        """The document-level fields (one value per document, objects as structs; record types are
        :attr:`record_types`)."""
        return self._fields

    @property
    def resolved(self) -> Resolved:
        """The user's schema resolved (:mod:`memagent.extraction.resolve`): the derived schema the job
        reads, where every record type goes back, and the annotations ignored."""
        assert self._resolved is not None
        return self._resolved

    def assemble(self, doc: Mapping[str, Any], records: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, Any]:
        """One document's object in the user's shape: its fields and its records nested where the schema
        has them (read it back with the user's Pydantic model, or check it with :meth:`errors`)."""
        return self.resolved.assemble(doc, records)

    def errors(self, obj: Any) -> list[str]:
        """``path: message`` for each way ``obj`` (an :meth:`assemble` d object) fails the user's schema."""
        return self.resolved.errors(obj)

    @property
    def model(self) -> Any:
        """The Pydantic model the schema came from (``x-pydantic-model``), imported; None for a JSON Schema."""
        spec = self.root.get(MODEL_KEYWORD)
        return model_named(spec) if isinstance(spec, str) else None

    @property
    def record_types(self) -> tuple[RecordType, ...]:
        return self._records

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._fields)

    def record_type(self, name: str) -> RecordType:
        for r in self._records:
            if r.name == name:
                return r
        raise KeyError(f"the schema has no record type {name!r}; it has {', '.join(r.name for r in self._records)}")

    def decoding_schema(self) -> dict[str, Any]:
        """The schema final replies are constrained to and validated against: the document-level fields only."""
        props = {f.name: clean(self.resolved.schema["properties"][f.name]) for f in self._fields}
        return {"type": "object", "properties": props, "required": [f.name for f in self._fields if f.required],
                "additionalProperties": False}

    def decoding_schema_json(self) -> str:
        """:meth:`decoding_schema` as JSON text (``SamplingParams.json_schema``)."""
        return json.dumps(self.decoding_schema(), ensure_ascii=False)

    def records_schema(self, name: str, max_items: int = RECORDS_PER_CALL) -> dict[str, Any]:
        """The schema of one per-chunk records call of record type ``name``: a JSON array (possibly
        empty) of at most ``max_items`` records under the item schema. Every engine bounds it with
        :func:`memagent.engines.json_schema.render_schema`; validate replies against it.

        A keyed type's item requires its key only: a record's other values may be stated chunks apart
        (an invoice's issue here, its settlement later), so a mention states what its chunk does (a
        grammar that forced the rest would make the model invent it); merged by key, the record is held
        to the whole schema at the document's end (:meth:`incomplete_fields`)."""
        record = self.record_type(name)
        items = dict(record.item_schema or {})
        items["additionalProperties"] = False
        if record.key:
            items["required"] = [r for r in items.get("required") or [] if r in record.key]
        return {"type": "array", "items": items, "maxItems": max_items}

    def mention_errors(self, name: str, values: Mapping[str, Any]) -> list[str]:
        """:meth:`Resolved.record_errors` of one mention, less the absent non-key required values (which
        a later mention may state: :meth:`records_schema`)."""
        key = set(self.record_type(name).key)
        return [e for e in self.resolved.record_errors(name, values)
                if not ((m := _MISSING.match(e)) and key and m.group(1) not in key)]

    def incomplete_fields(self, name: str, values: Mapping[str, Any]) -> list[str]:
        """The required values (top level: ``settled``; nested: ``address.city``) a merged record lacks, and
        the path of any other way it fails its item in the user's schema; empty when it is whole. A record
        with one breaks the user's schema and is never written."""
        out = []
        for e in self.resolved.record_errors(name, values):
            path, _, _ = e.partition(": ")
            m = _MISSING_AT.match(e)
            name_ = m.group(2) if m else None
            out.append(path if name_ is None else name_ if path == "(root)" else f"{path}.{name_}")
        return list(dict.fromkeys(out))

    def records_schema_json(self, name: str, max_items: int = RECORDS_PER_CALL) -> str:
        """:meth:`records_schema` as JSON text (``SamplingParams.json_schema`` of a records call)."""
        return json.dumps(self.records_schema(name, max_items), ensure_ascii=False)

    def reply_errors(self, obj: Any) -> list[Any]:
        """The final reply's validation errors under :meth:`decoding_schema` (formats checked), path order."""
        return sorted(validator(self.decoding_schema_json()).iter_errors(obj), key=lambda e: list(e.path))

    def valid_records(self, name: str, items: list[Any]) -> tuple[list[dict[str, Any]], int]:
        """The items of a records reply valid under record type ``name``'s item schema (formats checked:
        ``2021-02-31`` is no date), and how many were not: one bad item never costs its neighbours."""
        item = validator(json.dumps(self.records_schema(name)["items"], ensure_ascii=False))
        items = [without_nulls(x) for x in items]
        valid = [x for x in items if not any(True for _ in item.iter_errors(x))
                 and not self.mention_errors(name, x)]
        return valid, len(items) - len(valid)

    def question(self, group: FieldGroup | None = None) -> str:
        """The question of every memory-update and the final-answer call: the field list (and the record types).
        With ``group`` (a wide schema's final call, :meth:`field_groups`): that group's fields only."""
        fields = self._fields if group is None else group.fields
        text = ""
        if fields:
            text = ("Extract these fields from the document:\n" + "\n".join(f.question_line() for f in fields)
                    + "\nFor each field keep every candidate value with where it was seen; "
                    "a later correction or amendment replaces an earlier value.")
        if self._records and group is None:
            text += "\n" if text else ""
            text += "List every record of these types the document states:\n" + "\n".join(
                self.record_lines(r) for r in self._records)
            text += ("\nKeep what later passages need to read records: names and their aliases or roles, "
                     "definitions, amendments, and the keys of the records already seen.")
        return text

    def memory_question(self, answer_tokens: int) -> str:
        """The question of every memory update and records call: :meth:`question`, or for a wide schema (one
        whose final answer splits into several groups at ``answer_tokens``, or whose full question is over its
        share of the window, :data:`MEMORY_QUESTION_TOKENS` at 3 bytes a token) the compact field list: names
        only, an object's fields in braces, record types one line per family (its fields once, its lists'
        names), each kind and description left to the call that decodes it (a group call, a records call)."""
        full = self.question()
        if len(self.field_groups(answer_tokens)) <= 1 and len(full.encode()) <= 3 * MEMORY_QUESTION_TOKENS:
            return full
        text = ""
        if self._fields:
            text = ("Extract these fields from the document (an object's fields in braces):\n"
                    + "\n".join(f"- {compact_name(f)}" for f in self._fields)
                    + "\nFor each field keep every candidate value with where it was seen; "
                    "a later correction or amendment replaces an earlier value.")
        if self._records:
            text += "\n" if text else ""
            text += ("List every record of these types the document states (the records of a list hold the "
                     "fields in parentheses):\n" + compact_record_lines(self._families))
            text += ("\nKeep what later passages need to read records: names and their aliases or roles, "
                     "definitions, amendments, and the keys of the records already seen.")
        return text

    @staticmethod
    def record_lines(record: RecordType) -> str:
        """A record type in prompt words: its name, key and one line per field."""
        head = f"- {record.name}: records"
        head += f" identified by {', '.join(record.key)}" if record.key else ""
        head += f"; {record.description.strip()}" if record.description and record.description.strip() else ""
        return "\n".join([head, *(f.question_line("  ") for f in record.fields)])

    def answer_instruction(self, group: FieldGroup | None = None) -> str:
        """The final call's format sentence (replaces the answer style's); with ``group``, that group's call."""
        fields = self._fields if group is None else group.fields
        required = [f.name for f in fields if f.required]
        optional = [f.name for f in fields if not f.required]
        text = f"Reply with one JSON object with the keys {', '.join(f.name for f in fields)} and nothing else"
        text += " (dates as YYYY-MM-DD)." if any(f.kind == "date" for _, f, _ in iter_leaves(fields, {})) \
            else "."
        if optional:
            text += f" Leave out {', '.join(optional)} when the memory holds no value for it."
        if required:
            text += f" Always give {', '.join(required)}."
        return text

    def records_instruction(self, name: str) -> str:
        """The format sentence of a records call of record type ``name``."""
        record = self.record_type(name)
        keys = ", ".join(f.name for f in record.fields)
        return (f"Reply with a JSON array of the {name} records this passage states, each an object with the keys "
                f"{keys} (dates as YYYY-MM-DD; leave out a key the passage does not state), and nothing else; "
                "[] when it states none.")

    def memory_tokens_needed(self) -> int:
        """The memory the fields need (a value and where it was seen each) and what later chunks must carry
        per family of record types (keys seen, aliases, an open record), not a share per type."""
        return MEMORY_TOKENS_PER_FIELD * len(self._fields) + MEMORY_TOKENS_PER_RECORD_FAMILY * len(self._families)

    @property
    def record_families(self) -> tuple[RecordFamily, ...]:
        """The record types in families sharing one item schema (:mod:`memagent.extraction.record_groups`)."""
        return self._families

    def record_groups(self, reply_tokens: int) -> tuple[RecordGroup, ...]:
        """The record types packed into the groups one records call each asks for, for replies of
        ``reply_tokens`` (:func:`~memagent.extraction.record_groups.group_record_types`); computed once per budget
        (asked for every chunk)."""
        if reply_tokens not in self._groups:
            self._groups[reply_tokens] = group_record_types(self._families, reply_tokens)
        return self._groups[reply_tokens]

    def group_records_instruction(self, group: RecordGroup) -> str:
        """The request of a records call: a single type's (:meth:`records_instruction`) or a group's."""
        if len(group.names) == 1:
            return self.records_instruction(group.names[0])
        return group_instruction([self.record_type(n) for n in group.names], self._families)

    def group_records_schema_json(self, group: RecordGroup) -> str:
        """The decoding schema of a records call: a single type's array, or a group's object of arrays."""
        if len(group.names) == 1:
            return self.records_schema_json(group.names[0])
        arrays = {n: self.records_schema(n) for n in group.names}
        return json.dumps(records_group_schema(group, arrays), ensure_ascii=False)

    def answer_tokens_needed(self) -> int:
        """The most tokens the whole reply (all document fields in one call) takes at the least room a group
        leaves each value (:func:`memagent.extraction.groups.reply_tokens`)."""
        return BRACES_TOKENS + sum(map(reply_tokens, self._fields))

    def field_groups(self, answer_tokens: int) -> tuple[FieldGroup, ...]:
        """The document fields in final-answer groups of at most ``answer_tokens`` each
        (:mod:`memagent.extraction.groups`); one group when they fit (none without fields).
        ``ValueError`` naming the leaf that alone does not fit."""
        return group_fields(self._fields, answer_tokens) if self._fields else ()

    def answer_schemas(self, group: FieldGroup, answer_tokens: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """One final call's schemas: the group's decoding schema (replies are validated against it) and the one
        the call is constrained to, bounded so every reply closes within ``answer_tokens``
        (:mod:`memagent.extraction.answer_bounds`)."""
        user = group_schema(self.decoding_schema()["properties"], group)
        return user, budgeted_json(user, answer_tokens)

    def answer_room_tokens(self) -> int:
        """The answer budget a default gives this schema: room for each string of the reply
        (:func:`memagent.extraction.answer_bounds.answer_room_tokens`); 0 without document fields."""
        return answer_room_tokens(self.decoding_schema()) if self._fields else 0

    def grouping(self, answer_tokens: int) -> str:
        """The grouping in words: how many final calls a document gets and what each asks for."""
        return grouping_report(self.field_groups(answer_tokens), answer_tokens)

    def check_budgets(self, memory_tokens: int, answer_tokens: int) -> None:
        """``ValueError`` naming the budget to raise when the memory cannot hold the fields or a single field's
        reply does not fit the answer (wider schemas are split into answer groups: :meth:`field_groups`)."""
        n = len(self._fields) + len(self._records)
        if memory_tokens < self.memory_tokens_needed():
            raise ValueError(f"memory_tokens={memory_tokens} cannot hold the {n} field(s) of the schema (about "
                             f"{MEMORY_TOKENS_PER_FIELD} tokens a field); raise memory_tokens to "
                             f"{self.memory_tokens_needed()} or more, or extract fewer fields")
        self.field_groups(answer_tokens)


def _check_dotted_names(fields: tuple[FieldSpec | ObjectSpec, ...], records: tuple[RecordType, ...]) -> None:
    """Refuse two values with one dotted name (a top-level ``a.b`` beside an object ``a`` holding ``b``): the
    evidence, the report and a record type's folder name each by that name."""
    def leaves(specs: tuple[FieldSpec | ObjectSpec, ...], prefix: str, where: str) -> Any:
        for f in specs:
            if isinstance(f, ObjectSpec):
                yield from leaves(f.fields, f"{prefix}{f.name}.", f"{where}{f.name!r} {{...}}: ")
            else:
                yield f"{prefix}{f.name}", f"{where}field {f.name!r}"

    seen: dict[str, str] = {}
    for path, what in [*leaves(fields, "", ""), *((r.name, f"record type {r.name!r}") for r in records)]:
        other = seen.setdefault(path, what)
        if other != what:
            raise ValueError(f"properties: {other} and {what} have one dotted name {path!r} (in field_evidence, "
                             "the report and the records' folders); rename one")


_MISSING_AT = re.compile(r"^(.*): '(.+)' is a required property$")  # jsonschema's message, as Resolved writes it
_MISSING = re.compile(r"^\(root\): '(.+)' is a required property$")


def _model_schema(data: Any) -> Any:
    """A Pydantic model class as its JSON Schema (``model_json_schema()``); anything else as given."""
    from pydantic import BaseModel

    if isinstance(data, type) and issubclass(data, BaseModel):
        spec = f"{data.__module__}:{data.__qualname__}"
        return {**data.model_json_schema(), **({MODEL_KEYWORD: spec} if _importable(spec, data) else {})}
    return data


def _importable(spec: str, model: type) -> bool:
    """Whether ``module:Model`` imports ``model`` itself again (a worker reimports it from the config); a model
    of ``__main__`` or defined in a function is not (its own validators are then not checked in the job)."""
    if spec.startswith("__main__:") or "<locals>" in spec:
        return False
    try:
        return load_model(spec) is model
    except ValueError:
        return False


def load_schema(path: str | PathLike[str] | type) -> ExtractionSchema:
    """Read and check a JSON Schema file, or a Pydantic model (a class, or ``module:Model``); every problem
    is a one-line ``ValueError`` naming the file or model."""
    if isinstance(path, type):
        return schema_from(path, f"model {path.__name__}")
    if isinstance(path, str) and ":" in path and not Path(path).expanduser().exists() \
            and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", path):
        return schema_from(load_model(path), f"model {path}")
    path = Path(path).expanduser()
    try:
        with path.open("rb") as f:  # read with a bound whatever the file is (a device's size reads 0)
            raw = f.read(MAX_SCHEMA_FILE_BYTES + 1)
        if len(raw) > MAX_SCHEMA_FILE_BYTES:  # not read in full: JSON text this large is no schema
            raise ValueError(f"schema file {path}: the schema is larger than {MAX_SCHEMA_CHARS // 1024} KiB of "
                             "JSON; every field goes into every prompt: extract fewer fields or shorten their "
                             "descriptions")
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"schema file {path}: the schema is nested more than {MAX_DEPTH} levels deep") from None
    except FileNotFoundError:
        raise ValueError(f"schema file {path} not found") from None
    except OSError as e:
        raise ValueError(f"schema file {path} cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"schema file {path} is not valid JSON: {e}") from None
    return schema_from(unwrapped(data), f"schema file {path}")


# Files that hold a schema under one key: OpenAI's `response_format` `json_schema` object (`name`, `schema`,
# `strict`) and ExtractBench's (`name`, `description`, `schema_definition`).
SCHEMA_WRAPPER_KEYS = ("schema", "json_schema", "schema_definition")


def unwrapped(data: Any) -> Any:
    """The schema a wrapper file holds (``{"name": …, "schema": {…}}``, ``{"json_schema": {…}}``,
    ``{"schema_definition": {…}}``); ``data`` itself when it is a schema (it has ``type``, ``properties`` or
    ``$ref``) or holds no wrapper key."""
    while isinstance(data, dict) and not {"type", "properties", "$ref"} & data.keys():
        inner = [data[k] for k in SCHEMA_WRAPPER_KEYS if isinstance(data.get(k), dict)]
        if len(inner) != 1:
            return data
        data = inner[0]
    return data


def schema_from(data: Any, where: str = "schema") -> ExtractionSchema:
    """``ExtractionSchema(data)`` (a JSON Schema, or a Pydantic model class) with a one-line ``ValueError``
    prefixed by ``where``."""
    from pydantic import ValidationError

    try:
        return ExtractionSchema(data)
    except RecursionError:  # pragma: no cover - check_size refuses deep data before anything recurses
        raise ValueError(f"{where}: the schema is nested more than {MAX_DEPTH} levels deep") from None
    except ValidationError as e:
        raise ValueError(f"{where}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
