"""The derived schema (what :func:`memagent.extraction.resolve.resolve` writes of the user's) as specs: fields and
record types, with every problem named by its JSON path.

:func:`parse_schema` reads only the derived schema: ``$ref``, ``allOf``, unions, ``const``, formats and
annotations are already resolved there (a union that no one column holds is a leaf with ``x-kind``), and it
decides nothing about what a keyword means: which keywords each node may hold is the resolver's vocabulary
(:mod:`memagent.extraction.keywords`), refused here only as a broken promise. What it checks itself is what
the specs need: names (reserved columns, dots, folding, sizes), enum sizes, ``x-key`` and the nesting depth
of objects. Its shape::

    schema       {"type": "object", "properties": {name: field | record type}, "required": [names],
                  "additionalProperties": false, "description", "title", "$schema", "$id"}
    field        a leaf of one kind (memagent.extraction.kinds: string, date, number, integer,
                 boolean, enum of strings, array of strings) with "description" and "title"
    record type  {"type": "array", "items": item, "x-key": [names], "description", "title"}
    item         {"type": "object", "properties": {name: field | object}, "required": [names],
                  "additionalProperties": false, "description", "title"}
    object       like item, nested at most MAX_OBJECT_DEPTH deep inside an item

``x-key`` names required scalar properties of the item: two mentions with equal (normalised) key
values are one record (memagent.extraction.records). An error reads ``<path>: <what is wrong>``,
e.g. ``properties.payments.items.properties.amount: property 'amount' uses the unsupported keyword
'foo'``.

**Limits** (a schema past them is refused at load with one line, never a traceback):
:data:`MAX_SCHEMA_CHARS` of JSON, :data:`MAX_DEPTH` levels of JSON nesting,
:data:`MAX_ENUM_VALUES` values in one enum,
:data:`MAX_NAME_CHARS` characters in a property name. Names that could break the records dataset
are refused too (:func:`check_names`): a name of dots only (a record type's folder would be the
output root or the records root), a record type's name over :data:`MAX_TYPE_NAME_BYTES` bytes of
UTF-8 (its percent-quoted folder name stays under the 255-byte limit of file systems), two names
of one object that are equal after Unicode NFKC normalisation and case folding (one folder, or one
column for a case-insensitive reader), and a dot in a record's property name (the dotted leaf path
of a nested object, ``bank.name``, would name two leaves). How many fields a schema may have is set
by the budgets, not a count: the field list must fit ``query_tokens`` and the model's window, and the
final answer is split into field groups that fit ``answer_tokens`` (:mod:`memagent.extraction.groups`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from memagent.extraction.keywords import OBJECT_KEYWORDS, PROPERTY_KEYWORDS, RECORD_KEYWORDS, TOP_KEYWORDS
from memagent.extraction.kinds import KINDS, SCALAR_KINDS, FieldKind, kind_of
from memagent.json_walk import walk_json

MAX_SCHEMA_CHARS = 256 * 1024
MAX_DEPTH = 32
MAX_ENUM_VALUES = 500
MAX_NAME_CHARS = 64
# A record type's folder is its name percent-quoted (3 characters per UTF-8 byte at most): 64 bytes
# make at most 192 of the 255 bytes a file system allows in one name.
MAX_TYPE_NAME_BYTES = 64
MAX_OBJECT_DEPTH = 6  # objects inside an item's objects inside an item's ...

SUPPORTED = ("string, number, integer, boolean, string with format date, enum, "
             "array of strings, object, array of objects (a record type)")


@dataclass(frozen=True)
class FieldSpec:
    """One leaf property: its (column) name, kind, description and enum values."""

    name: str
    kind: FieldKind
    required: bool
    description: str | None = None
    enum: tuple[str, ...] = ()

    def question_line(self, indent: str = "") -> str:
        what = KINDS[self.kind].describe(self.enum)
        line = f"{indent}- {self.name} ({what}{', required' if self.required else ''})"
        return line + (f": {self.description.strip()}" if self.description and self.description.strip() else "")


@dataclass(frozen=True)
class ObjectSpec:
    """A nested object inside a record: its properties are fields or objects (a struct column)."""

    name: str
    required: bool
    fields: tuple[FieldSpec | ObjectSpec, ...]
    description: str | None = None

    def question_line(self, indent: str = "") -> str:
        head = f"{indent}- {self.name} (object{', required' if self.required else ''})"
        head += f": {self.description.strip()}" if self.description and self.description.strip() else ""
        return "\n".join([head, *(f.question_line(indent + "  ") for f in self.fields)])


@dataclass(frozen=True)
class RecordType:
    """An array-of-objects property: every record of one type the document states."""

    name: str
    fields: tuple[FieldSpec | ObjectSpec, ...]
    key: tuple[str, ...] = ()
    description: str | None = None
    item_schema: Mapping[str, Any] | None = None  # the items node without titles and x- keywords
    default_key: bool = False  # the key was not named (x-key) but chosen to tie child types to their parent

    def leaves(self, values: Mapping[str, Any]) -> Iterator[tuple[str, FieldSpec, Any]]:
        """``(dotted path, field, value)`` of every leaf of a record (absent leaves as None)."""
        yield from iter_leaves(self.fields, values)

    def field(self, name: str) -> FieldSpec | ObjectSpec:
        return next(f for f in self.fields if f.name == name)


def iter_leaves(fields: tuple[FieldSpec | ObjectSpec, ...], values: Any,
                prefix: str = "") -> Iterator[tuple[str, FieldSpec, Any]]:
    values = values if isinstance(values, Mapping) else {}
    for f in fields:
        if isinstance(f, ObjectSpec):
            yield from iter_leaves(f.fields, values.get(f.name), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, values.get(f.name)


def join(path: str, name: Any) -> str:
    """``path.name``, or ``path["odd name"]`` for a name that is not a plain identifier."""
    if isinstance(name, str) and re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$-]*", name):
        return f"{path}.{name}" if path else name
    return f"{path}[{json.dumps(name, ensure_ascii=True)}]"


def show(value: Any, limit: int = 80) -> str:
    """A JSON value for an error line: one line, at most ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_size(data: Any) -> None:
    """Refuse data nested deeper than :data:`MAX_DEPTH` or larger than :data:`MAX_SCHEMA_CHARS` (no recursion)."""
    chars = 0
    for path, node in walk_json(data):
        if len(path) + 1 > MAX_DEPTH:
            raise ValueError(f"the schema is nested more than {MAX_DEPTH} levels deep; a schema has at most "
                             f"{MAX_DEPTH} (records hold objects {MAX_OBJECT_DEPTH} levels deep)")
        if isinstance(node, dict):
            chars += sum(len(str(k)) + 4 for k in node)
        chars += len(node) + 2 if isinstance(node, str) else 2
        if chars > MAX_SCHEMA_CHARS:
            raise ValueError(f"the schema is larger than {MAX_SCHEMA_CHARS // 1024} KiB of JSON; every field goes "
                             "into every prompt: extract fewer fields or shorten their descriptions")


def _name(path: str, name: Any, reserved: tuple[str, ...], what: str) -> None:
    if not isinstance(name, str) or not name.strip() or name != name.strip() or \
            any(unicodedata.category(c).startswith("C") for c in name):
        raise ValueError(f"{path}: a property name must be a non-empty string without surrounding spaces "
                         "or control characters")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"{path}: a property name has at most {MAX_NAME_CHARS} characters")
    if name in reserved:
        raise ValueError(f"{path}: property {name!r} clashes with a column of {what} ({name}); rename it")
    if not name.strip("."):
        raise ValueError(f"{path}: a property name of dots only ({name!r}) would name a folder of the output; "
                         "rename it")


def fold(name: str) -> str:
    """The form two names must not share: NFKC, case folded (twice: folding can undo NFKC)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def check_names(path: str, names: Iterator[str] | list[str]) -> None:
    """Refuse two names of one ``properties`` that differ only in case or Unicode form: they would
    land in one folder (a record type on a case-insensitive file system) or one column (Spark, pandas
    ``str.lower`` users) — ``path`` is the ``properties`` object's."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(fold(name), name)
        if other != name:
            raise ValueError(f"{join(path, name)}: property {name!r} is the same name as {other!r} after case "
                             "folding and Unicode normalisation (one folder or column); rename one")


def _record_property_name(path: str, name: str) -> None:
    if "." in name:
        raise ValueError(f"{path}: a record's property name may not contain '.' ({name!r}: dotted paths name "
                         f"nested objects); use a nested object, e.g. "
                         f"{{{json.dumps(name.split('.', 1)[0])}: {{\"type\": \"object\", \"properties\": ...}}}}")


def _type_name(path: str, name: str) -> None:
    size = len(name.encode("utf-8"))
    if size > MAX_TYPE_NAME_BYTES:
        raise ValueError(f"{path}: a record type's name is its folder's name: at most {MAX_TYPE_NAME_BYTES} bytes "
                         f"of UTF-8, {name[:16]!r}... has {size}; shorten it")


def _description(path: str, node: Mapping[str, Any]) -> str | None:
    description = node.get("description")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"{path}: description must be a string")
    return description


def parse_leaf(path: str, name: str, prop: Any, required: bool) -> FieldSpec:
    """A leaf property (see :mod:`memagent.extraction.kinds`); ``ValueError`` naming ``path``."""
    where = f"{path}: property {name!r}"
    if not isinstance(prop, dict):
        raise ValueError(f"{where} must be an object such as {{\"type\": \"string\"}}, got {show(prop)}")
    unknown = sorted(k for k in set(prop) - PROPERTY_KEYWORDS if not k.startswith("x-"))
    if unknown:
        raise ValueError(f"{where} uses the unsupported keyword {unknown[0]!r}; a property may have "
                         f"{', '.join(sorted(PROPERTY_KEYWORDS))}")
    description = _description(path, prop)
    kind_type, fmt = prop.get("type"), prop.get("format")
    if fmt is not None and not (kind_type == "string" and fmt == "date"):
        shown = repr(fmt) if isinstance(fmt, str) else show(fmt)
        raise ValueError(f"{where}: format {shown[:80]} is not supported; only \"format\": \"date\" on a string")
    if "enum" in prop:
        values = prop["enum"]
        if kind_type not in (None, "string", "integer", "number", "boolean") or fmt is not None or "items" in prop:
            raise ValueError(f"{where}: an enum must be of scalars (no format or items)")
        if kind_type in (None, "string") and (not isinstance(values, list) or not values or
                                              not all(isinstance(v, str) and v for v in values)):
            raise ValueError(f"{where}: enum must be a non-empty list of non-empty strings, got {show(values)}")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: enum must be a non-empty list, got {show(values)}")
        if len(values) > MAX_ENUM_VALUES:
            raise ValueError(f"{where}: enum has {len(values)} values, at most {MAX_ENUM_VALUES} (every value "
                             "goes into every prompt); use a string field instead")
        if len(set(values)) != len(values):
            raise ValueError(f"{where}: enum has duplicate values")
    elif "items" in prop and kind_type != "array":
        raise ValueError(f"{where}: items is only supported with type array")
    elif kind_type == "array" and kind_of(prop) != "string_array":
        raise ValueError(f"{where}: an array must have items {{\"type\": \"string\"}} (arrays of strings only"
                         f"{'' if path.count('properties') > 1 else ', or objects for a record type'}), "
                         f"got items {show(prop.get('items'))}")
    elif kind_type is None and "x-kind" not in prop:
        raise ValueError(f"{where} has no type; supported: {SUPPORTED}")
    kind = kind_of(prop)
    if kind is None:
        raise ValueError(f"{where}: type {show(kind_type)} is not supported; supported: {SUPPORTED}")
    enum = tuple(prop.get("enum") or ()) if kind == "enum" else ()
    return FieldSpec(name, kind, required, description, enum)


def _required(path: str, node: Mapping[str, Any], props: Mapping[str, Any]) -> list[str]:
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{join(path, 'required')}: required must be a list of property names, got {show(required)}")
    missing = [r for r in required if r not in props]
    if missing:
        raise ValueError(f"{join(path, 'required')}: required names property {missing[0]!r}, which is not under "
                         "properties")
    return required


def _check_object(node: Mapping[str, Any], allowed: set[str], unknown: Callable[[str], str], closed: str) -> None:
    """Refuse a keyword outside ``allowed`` (``unknown(keyword)`` says so) and an open ``additionalProperties``."""
    extra = sorted(k for k in set(node) - allowed if not k.startswith("x-"))
    if extra:
        raise ValueError(unknown(extra[0]))
    if node.get("additionalProperties", False) is not False:
        raise ValueError(closed)


def parse_object(path: str, node: Any, reserved: tuple[str, ...], depth: int) -> tuple[FieldSpec | ObjectSpec, ...]:
    """The properties of an item or nested object at ``path``."""
    if not isinstance(node, dict) or node.get("type") != "object":
        raise ValueError(f"{path}: must be an object schema {{\"type\": \"object\", \"properties\": ...}}, "
                         f"got {show(node)}")
    _check_object(node, OBJECT_KEYWORDS, lambda k: f"{join(path, k)}: unknown keyword {k!r}; an object may have "
                  f"{', '.join(sorted(OBJECT_KEYWORDS))}", f"{join(path, 'additionalProperties')}: must be false or absent")
    _description(path, node)
    props = node.get("properties")
    if not isinstance(props, dict) or not props:
        raise ValueError(f"{join(path, 'properties')}: an object needs at least one property")
    required = _required(path, node, props)
    check_names(join(path, "properties"), list(props))
    out: list[FieldSpec | ObjectSpec] = []
    for name, prop in props.items():
        where = join(join(path, "properties"), name)
        _name(where, name, reserved, "the records output")
        _record_property_name(where, name)
        if isinstance(prop, dict) and prop.get("type") == "object":
            if depth >= MAX_OBJECT_DEPTH:
                raise ValueError(f"{where}: objects nest at most {MAX_OBJECT_DEPTH} levels inside a record")
            out.append(ObjectSpec(name, name in required, parse_object(where, prop, (), depth + 1),
                                  prop.get("description")))
        else:
            out.append(parse_leaf(where, name, prop, name in required))
    return tuple(out)


def clean(node: Any) -> Any:
    """A node without titles and ``x-`` keywords: what replies are validated and decoded against."""
    if not isinstance(node, dict):
        return node
    out = {k: clean(v) for k, v in node.items() if k != "title" and not k.startswith("x-") and k != "properties"}
    if "properties" in node:
        out["properties"] = {k: clean(v) for k, v in node["properties"].items()}
    return out


def parse_record_type(path: str, name: str, node: dict[str, Any], reserved: tuple[str, ...]) -> RecordType:
    """An array-of-objects property at ``path`` (see the module docstring)."""
    unknown = sorted(set(node) - RECORD_KEYWORDS)
    if unknown:
        raise ValueError(f"{join(path, unknown[0])}: unknown keyword {unknown[0]!r}; a record type may have "
                         f"{', '.join(sorted(RECORD_KEYWORDS))}")
    description = _description(path, node)
    fields = parse_object(join(path, "items"), node.get("items"), reserved, 1)
    key = node.get("x-key", [])
    kpath = join(path, "x-key")
    if not isinstance(key, list) or not all(isinstance(k, str) for k in key) or len(set(key)) != len(key):
        raise ValueError(f"{kpath}: must be a list of distinct property names of the items, got {show(key)}")
    by_name = {f.name: f for f in fields}
    for k in key:
        f = by_name.get(k)
        if f is None:
            raise ValueError(f"{kpath}: names {k!r}, which is not a property of the items")
        if isinstance(f, ObjectSpec) or f.kind not in SCALAR_KINDS or not f.required:
            raise ValueError(f"{kpath}: key property {k!r} must be a required scalar ({', '.join(SCALAR_KINDS)}) "
                             "of the items")
    return RecordType(name, fields, tuple(key), description, clean(node["items"]), node.get("x-key-default") is True)


def parse_schema(schema: Any, reserved: tuple[str, ...] = (),
                 record_reserved: tuple[str, ...] = ()) -> tuple[tuple[FieldSpec | ObjectSpec, ...],
                                                                tuple[RecordType, ...]]:
    """``(document-level fields, record types)`` of a schema; ``ValueError`` naming the path of what is wrong.

    ``reserved``: names a top-level property may not take (output columns); ``record_reserved``:
    names a record's property may not take (the records output's own columns).
    """
    check_size(schema)
    if not isinstance(schema, dict):
        raise ValueError(f"the schema must be a JSON object, got {type(schema).__name__}")
    if schema.get("type") != "object":
        raise ValueError(f"the schema must have \"type\": \"object\" (one object per document), "
                         f"got type {show(schema.get('type'))}")
    _check_object(schema, TOP_KEYWORDS, lambda k: f"the schema uses the unsupported keyword {k!r} at the top; "
                  f"supported: {', '.join(sorted(TOP_KEYWORDS))}",
                  "additionalProperties must be false or absent: every extracted field needs a declared type")
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        raise ValueError("the schema has no properties: declare at least one field under \"properties\"")
    required = _required("", schema, props)
    check_names("properties", list(props))
    fields: list[FieldSpec | ObjectSpec] = []
    records: list[RecordType] = []
    for name, prop in props.items():
        where = join("properties", name)
        _name(where, name, reserved, "the batch input or output")
        items = prop.get("items") if isinstance(prop, dict) else None
        if isinstance(prop, dict) and prop.get("type") == "array" and isinstance(items, dict) \
                and items.get("type") == "object":
            _type_name(where, name)
            records.append(parse_record_type(where, name, prop, record_reserved))
        elif isinstance(prop, dict) and prop.get("type") == "object":
            _record_property_name(where, name)
            fields.append(ObjectSpec(name, name in required, parse_object(where, prop, (), 1), prop.get("description")))
        else:
            fields.append(parse_leaf(where, name, prop, name in required))
    return tuple(fields), tuple(records)
