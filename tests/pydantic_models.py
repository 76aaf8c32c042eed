"""Hypothesis strategies for the Pydantic models users write for extraction, with a gold instance each.

:func:`models` draws a model class built with ``pydantic.create_model``: scalar fields (str, int,
float, bool, date, datetime, ``Literal`` of strings or integers, constrained ints and strings),
``Optional`` with and without a default, unions of scalars, nested models, ``list[str]``, lists of
models and lists of models inside them (rows inside groups), descriptions and aliases.
:func:`instances` draws a JSON-ready gold object valid for a drawn model. Within the documented
limits (docs/extraction.md: names without dots, objects at most 6 deep, lists of lists of scalars
refused) every drawn model must be accepted.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Annotated, Any, Literal, Optional

from hypothesis import strategies as st
from pydantic import BaseModel, Field, create_model

from memagent.extraction.schema import INPUT_COLUMNS
from memagent.result_schema import EXTRA_OUTPUT_COLUMNS, RESULT_COLUMNS

_names = itertools.count()
NAME = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(
    lambda n: n not in {*INPUT_COLUMNS, *RESULT_COLUMNS, *EXTRA_OUTPUT_COLUMNS, "model", "config", "memory"}
    and not n.startswith(("n_records_", "record_", "evidence_", "answer_", "grounding_", "schema_", "field_",
                          "checkpoint", "resumed", "n_chunks", "context_", "node_", "input_", "mentions",
                          "first_chunk", "last_chunk", "records_")))
WORDS = st.text("abcdefghij klmnop", min_size=1, max_size=12).map(str.strip).filter(bool)

SCALARS: dict[str, Any] = {
    "str": str, "int": int, "float": float, "bool": bool, "date": dt.date, "datetime": dt.datetime,
    "lit_str": Literal["alpha", "beta", "gamma"], "lit_int": Literal[1, 2, 3],
    "small_int": Annotated[int, Field(ge=0, le=100)], "short_str": Annotated[str, Field(max_length=12)],
    "code": Annotated[str, Field(pattern=r"^[A-Z]{3}$")], "int_or_str": int | str, "int_or_float": int | float,
}


def scalar_value(kind: str) -> st.SearchStrategy[Any]:
    """JSON values of a scalar kind (dates as ISO text, as a JSON reply writes them)."""
    return {
        "str": WORDS, "short_str": WORDS.map(lambda s: s[:12]), "code": st.sampled_from(["USD", "EUR", "GBP"]),
        "int": st.integers(-10**6, 10**6), "small_int": st.integers(0, 100),
        "float": st.integers(-10**6, 10**6).map(lambda n: n / 4),
        "bool": st.booleans(), "lit_str": st.sampled_from(["alpha", "beta", "gamma"]),
        "lit_int": st.sampled_from([1, 2, 3]), "int_or_str": st.one_of(st.integers(0, 99), WORDS),
        "int_or_float": st.one_of(st.integers(0, 99), st.integers(0, 99).map(lambda n: n + 0.5)),
        "date": st.dates(dt.date(1990, 1, 1), dt.date(2030, 12, 31)).map(dt.date.isoformat),
        "datetime": st.datetimes(dt.datetime(1990, 1, 1), dt.datetime(2030, 12, 31)).map(
            lambda d: d.replace(microsecond=0).isoformat() + "Z"),
    }[kind]


# A drawn field: (name, alias or None, spec); spec is ("scalar", kind, optional, default_none) |
# ("strings",) | ("object", fields) | ("records", fields).
def _fields(depth: int, in_record: bool) -> st.SearchStrategy[list[tuple[str, str | None, tuple]]]:
    scalar = st.tuples(st.just("scalar"), st.sampled_from(sorted(SCALARS)), st.booleans(), st.booleans())
    options = [scalar, scalar, st.just(("strings",))]
    if depth < 3:
        options.append(st.deferred(lambda: _fields(depth + 1, in_record)).map(lambda f: ("object", f)))
        options.append(st.deferred(lambda: _fields(depth + 1, True)).map(lambda f: ("records", f)))
    field = st.tuples(NAME, st.one_of(st.none(), NAME.map(lambda n: f"The{n.title()}")), st.one_of(*options))
    first = st.tuples(NAME, st.none(), st.tuples(st.just("scalar"), st.sampled_from(["str", "int", "date"]),
                                                 st.just(False), st.just(False)))
    # A record type's items start with a required scalar: the default key that ties its children to it.
    return st.tuples(first if in_record else field, st.lists(field, max_size=4)).map(
        lambda t: _unique([t[0], *t[1]]))


def _unique(fields: list[tuple[str, str | None, tuple]]) -> list[tuple[str, str | None, tuple]]:
    seen: set[str] = set()
    out = []
    for name, alias, spec in fields:
        key = (alias or name).casefold()
        if key not in seen and name.casefold() not in seen:
            seen.update({key, name.casefold()})
            out.append((name, alias, spec))
    return out


def _model(fields: list[tuple[str, str | None, tuple]]) -> type[BaseModel]:
    defs: dict[str, Any] = {}
    for name, alias, spec in fields:
        extra = {"alias": alias} if alias else {}
        if spec[0] == "scalar":
            kind, optional, default_none = spec[1:]
            tp = SCALARS[kind]
            if optional:
                defs[name] = (Optional[tp], Field(None, **extra) if default_none else Field(..., **extra))
            else:
                defs[name] = (tp, Field(..., description=f"the {name}", **extra))
        elif spec[0] == "strings":
            defs[name] = (list[str], Field(default_factory=list, **extra))
        elif spec[0] == "object":
            defs[name] = (_model(spec[1]), Field(..., **extra))
        else:
            defs[name] = (list[_model(spec[1])], Field(default_factory=list, **extra))
    return create_model(f"M{next(_names)}", **defs)


@st.composite
def models(draw: st.DrawFn) -> tuple[type[BaseModel], list]:
    """``(model class, its drawn field specs)`` (the specs drive :func:`instances`)."""
    fields = draw(_fields(0, False))
    return _model(fields), fields


def _instance(draw: st.DrawFn, fields: list, key_values: set | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, (name, alias, spec) in enumerate(fields):
        out_name = alias or name
        if spec[0] == "scalar":
            kind, optional, default_none = spec[1:]
            if optional and draw(st.booleans()):
                if not default_none:
                    out[out_name] = None
                continue
            value = draw(scalar_value(kind))
            if i == 0 and key_values is not None:  # a record's key: distinct among its siblings
                value = draw(scalar_value(kind).filter(lambda v: str(v).casefold() not in key_values))
                key_values.add(str(value).casefold())
            out[out_name] = value
        elif spec[0] == "strings":
            out[out_name] = draw(st.lists(WORDS, max_size=3))
        elif spec[0] == "object":
            out[out_name] = _instance(draw, spec[1])
        else:
            keys: set = set()
            out[out_name] = [_instance(draw, spec[1], keys) for _ in range(draw(st.integers(0, 3)))]
    return out


@st.composite
def instances(draw: st.DrawFn, fields: list) -> dict[str, Any]:
    """A gold object (by alias, JSON-ready) for a model drawn with ``fields``."""
    return _instance(draw, fields)
