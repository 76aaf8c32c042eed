"""The extraction schema: a JSON Schema of the object to pull out of every document, checked on load.

Supported is the subset people write by hand: an object whose ``properties`` are each

============================ ============== =========================
JSON Schema                  kind           output column (nullable)
============================ ============== =========================
``{"type": "string"}``       string         string
``"format": "date"`` string  date           date32
``{"type": "number"}``       number         float64
``{"type": "integer"}``      integer        int64
``{"type": "boolean"}``      boolean        bool
``{"enum": [strings]}``      enum           string
``{"type": "array",          string_array   list<string>
"items": {"type": "string"}}``
============================ ============== =========================

with an optional ``description`` (and ``title``) per property, and ``required`` at the top. Any
other keyword, type or format is an error naming the property: a schema is loaded (and this
validation runs) before any model does. :class:`ExtractionSchema` is the raw JSON Schema as a
pydantic root model, so it sits inside :class:`memagent.config.AgentConfig` (``extraction``), is
recorded in the output's ``config`` column and in the resume fingerprint, and reads back equal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Literal

from pydantic import PrivateAttr, RootModel, model_validator

from memagent.result_schema import EXTRA_OUTPUT_COLUMNS, RESULT_COLUMNS

FieldKind = Literal["string", "date", "number", "integer", "boolean", "enum", "string_array"]

TOP_KEYWORDS = {"type", "properties", "required", "description", "title", "$schema", "$id", "additionalProperties"}
PROPERTY_KEYWORDS = {"type", "description", "title", "format", "enum", "items"}
SUPPORTED = ("string, number, integer, boolean, string with format date, enum of strings, "
             "array of strings")

# Input columns a job reads or passes with a meaning (a property may not take their names, nor an output's).
INPUT_COLUMNS = ("id", "question", "context", "answers", "metric")

# Rough budget sizes (tokens) for the up-front checks: what one field takes in the memory (a
# candidate value and where it was seen), and the JSON rendering of each kind of value.
MEMORY_TOKENS_PER_FIELD = 24
_VALUE_TOKENS = {"string": 12, "date": 8, "number": 8, "integer": 8, "boolean": 2, "string_array": 24}
_KIND_WORDS = {"string": "text", "date": "date, YYYY-MM-DD", "number": "number", "integer": "whole number",
               "boolean": "true or false", "string_array": "list of texts"}


@dataclass(frozen=True)
class FieldSpec:
    """One property of the schema: its output column name, kind, description and enum values."""

    name: str
    kind: FieldKind
    required: bool
    description: str | None = None
    enum: tuple[str, ...] = ()

    def question_line(self) -> str:
        what = f"one of: {', '.join(self.enum)}" if self.kind == "enum" else _KIND_WORDS[self.kind]
        line = f"- {self.name} ({what}{', required' if self.required else ''})"
        return line + (f": {self.description.strip()}" if self.description and self.description.strip() else "")

    def answer_tokens(self) -> int:
        """A rough size of ``"name": value,`` in tokens (about 3 characters a token)."""
        value = math.ceil(max(map(len, self.enum)) / 3) + 2 if self.kind == "enum" else _VALUE_TOKENS[self.kind]
        return math.ceil(len(self.name) / 3) + 3 + value


def _reserved_columns() -> tuple[str, ...]:
    return (*INPUT_COLUMNS, *RESULT_COLUMNS, *EXTRA_OUTPUT_COLUMNS)


def _property(name: Any, prop: Any, required: bool) -> FieldSpec:
    where = f"property {name!r}"
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(f"{where}: a property name must be a non-empty string without surrounding spaces")
    if name in _reserved_columns():
        raise ValueError(f"{where} clashes with a column of the batch input or output ({name}); rename it")
    if not isinstance(prop, dict):
        raise ValueError(f"{where}: must be an object such as {{\"type\": \"string\"}}, got {json.dumps(prop)}")
    unknown = sorted(set(prop) - PROPERTY_KEYWORDS)
    if unknown:
        raise ValueError(f"{where} uses the unsupported keyword {unknown[0]!r}; a property may have "
                         f"{', '.join(sorted(PROPERTY_KEYWORDS))}")
    description = prop.get("description")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"{where}: description must be a string")
    kind_type, fmt = prop.get("type"), prop.get("format")
    if fmt is not None and not (kind_type == "string" and fmt == "date"):
        raise ValueError(f"{where}: format {fmt!r} is not supported; only \"format\": \"date\" on a string")
    if "enum" in prop:
        values = prop["enum"]
        if kind_type not in (None, "string") or fmt is not None or "items" in prop:
            raise ValueError(f"{where}: an enum must be of strings (type string or no type, no format or items)")
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise ValueError(f"{where}: enum must be a non-empty list of non-empty strings, got {json.dumps(values)}")
        if len(set(values)) != len(values):
            raise ValueError(f"{where}: enum has duplicate values")
        return FieldSpec(name, "enum", required, description, tuple(values))
    if "items" in prop and kind_type != "array":
        raise ValueError(f"{where}: items is only supported with type array")
    if kind_type == "array":
        items = prop.get("items")
        if not isinstance(items, dict) or items.get("type") != "string" or set(items) - {"type", "description"}:
            raise ValueError(f"{where}: an array must have items {{\"type\": \"string\"}} (arrays of strings only), "
                             f"got items {json.dumps(items)}")
        return FieldSpec(name, "string_array", required, description)
    kinds: dict[Any, FieldKind] = {"string": "date" if fmt == "date" else "string", "number": "number",
                                   "integer": "integer", "boolean": "boolean"}
    if kind_type is None:
        raise ValueError(f"{where} has no type; supported: {SUPPORTED}")
    if not isinstance(kind_type, str) or kind_type not in kinds:
        raise ValueError(f"{where}: type {json.dumps(kind_type)} is not supported; supported: {SUPPORTED}")
    return FieldSpec(name, kinds[kind_type], required, description)


def parse_fields(schema: Any) -> tuple[FieldSpec, ...]:
    """The fields of a JSON Schema in the supported subset; ``ValueError`` naming what is wrong."""
    if not isinstance(schema, dict):
        raise ValueError(f"the schema must be a JSON object, got {type(schema).__name__}")
    if schema.get("type") != "object":
        raise ValueError(f"the schema must have \"type\": \"object\" (one object per document), "
                         f"got type {json.dumps(schema.get('type'))}")
    unknown = sorted(set(schema) - TOP_KEYWORDS)
    if unknown:
        raise ValueError(f"the schema uses the unsupported keyword {unknown[0]!r} at the top; "
                         f"supported: {', '.join(sorted(TOP_KEYWORDS))}")
    if schema.get("additionalProperties", False) is not False:
        raise ValueError("additionalProperties must be false or absent: every extracted field needs a declared type")
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        raise ValueError("the schema has no properties: declare at least one field under \"properties\"")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"required must be a list of property names, got {json.dumps(required)}")
    missing = [r for r in required if r not in props]
    if missing:
        raise ValueError(f"required names property {missing[0]!r}, which is not under properties")
    return tuple(_property(name, prop, name in required) for name, prop in props.items())


class ExtractionSchema(RootModel[dict[str, Any]]):
    """A JSON Schema (supported subset, see the module docstring) of what to extract from each document."""

    model_config = {"frozen": True}
    _fields: tuple[FieldSpec, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _parse(self) -> ExtractionSchema:
        self._fields = parse_fields(self.root)
        return self

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        return self._fields

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._fields)

    def decoding_schema(self) -> dict[str, Any]:
        """The schema replies are constrained to and validated against: declared properties only."""
        props = {f.name: {k: v for k, v in self.root["properties"][f.name].items() if k != "title"}
                 for f in self._fields}
        return {"type": "object", "properties": props, "required": [f.name for f in self._fields if f.required],
                "additionalProperties": False}

    def decoding_schema_json(self) -> str:
        """:meth:`decoding_schema` as JSON text (``SamplingParams.json_schema``)."""
        return json.dumps(self.decoding_schema(), ensure_ascii=False)

    def question(self) -> str:
        """The question of every memory-update and the final-answer call: the field list."""
        return ("Extract these fields from the document:\n" + "\n".join(f.question_line() for f in self._fields)
                + "\nFor each field keep every candidate value with where it was seen; "
                "a later correction or amendment replaces an earlier value.")

    def answer_instruction(self) -> str:
        """The final call's format sentence (replaces the answer style's)."""
        required = [f.name for f in self._fields if f.required]
        optional = [f.name for f in self._fields if not f.required]
        text = f"Reply with one JSON object with the keys {', '.join(self.names)} and nothing else"
        text += " (dates as YYYY-MM-DD)." if any(f.kind == "date" for f in self._fields) else "."
        if optional:
            text += f" Leave out {', '.join(optional)} when the memory holds no value for it."
        if required:
            text += f" Always give {', '.join(required)}."
        return text

    def memory_tokens_needed(self) -> int:
        return MEMORY_TOKENS_PER_FIELD * len(self._fields)

    def answer_tokens_needed(self) -> int:
        return 2 + sum(f.answer_tokens() for f in self._fields)

    def check_budgets(self, memory_tokens: int, answer_tokens: int) -> None:
        """``ValueError`` naming the budget to raise when the memory or the answer cannot hold the fields."""
        n = len(self._fields)
        if memory_tokens < self.memory_tokens_needed():
            raise ValueError(f"memory_tokens={memory_tokens} cannot hold the {n} field(s) of the schema (about "
                             f"{MEMORY_TOKENS_PER_FIELD} tokens a field); raise memory_tokens to "
                             f"{self.memory_tokens_needed()} or more, or extract fewer fields")
        if answer_tokens < self.answer_tokens_needed():
            need = self.answer_tokens_needed()
            raise ValueError(f"answer_tokens={answer_tokens} cannot hold the JSON object of the {n} field(s) of the "
                             f"schema (about {need} tokens); raise answer_tokens to {need} or more")


def load_schema(path: str | PathLike[str]) -> ExtractionSchema:
    """Read and check a JSON Schema file; every problem is a one-line ``ValueError`` naming the file."""
    path = Path(path).expanduser()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"schema file {path} not found") from None
    except OSError as e:
        raise ValueError(f"schema file {path} cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"schema file {path} is not valid JSON: {e}") from None
    return schema_from(data, f"schema file {path}")


def schema_from(data: Any, where: str = "schema") -> ExtractionSchema:
    """``ExtractionSchema(data)`` with a one-line ``ValueError`` prefixed by ``where``."""
    from pydantic import ValidationError

    try:
        return ExtractionSchema(data)
    except ValidationError as e:
        raise ValueError(f"{where}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
