"""Command-line flags derived from the typed configs: one default, one help text, one validation.

``add_model_flags(parser, EngineConfig, "engine")`` turns each field into a flag
(``max_batch_size`` -> ``--max-batch-size``; a field's ``json_schema_extra={"flag": ...}``
renames it), with the field's description and default as help. Every flag defaults to
``None``, so only what the user typed reaches the model and the model's own defaults and
cross-field checks apply. :func:`build` validates and phrases pydantic's errors in flag names.
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ValidationError


def parse_int(text: str) -> int:
    """``'4K'``/``'4k'`` -> 4096, ``'3000'`` -> 3000 (token counts are written both ways)."""
    t = text.strip().lower()
    try:
        return int(t[:-1]) * 1024 if t.endswith("k") else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (e.g. 3000 or 4K)") from None


def parse_list(kind: type = str):
    """The one comma-list parser: ``'8k,32k'`` -> ``[8192, 32768]`` for ints; empty items are an error."""

    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",")]
        if not any(items) or not all(items):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        if kind is int:
            return [parse_int(t) for t in items]
        try:
            return [kind(t) for t in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def parse_resource(text: str) -> tuple[str, float]:
    """``'gpu_worker=1'`` -> ``('gpu_worker', 1.0)``."""
    name, sep, amount = text.partition("=")
    try:
        if sep and name.strip():
            return name.strip(), float(amount)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=AMOUNT, e.g. gpu_worker=1")


class _DictAppend(argparse.Action):
    """Repeatable ``NAME=AMOUNT`` into a dict."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001
        current = dict(getattr(namespace, self.dest) or {})
        name, amount = values
        current[name] = amount
        setattr(namespace, self.dest, current)


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) is typing.Annotated:
        return _unwrap_optional(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _argparse_kwargs(annotation: Any) -> dict[str, Any] | None:
    """argparse options for a field type; None for types that are not flags (nested models)."""
    tp = _unwrap_optional(annotation)
    origin = typing.get_origin(tp)
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction}
    if tp is int:
        return {"type": parse_int}
    if tp in (float, str):
        return {"type": tp}
    if origin is Literal:
        return {"choices": list(typing.get_args(tp))}
    if origin in (list, tuple):
        item = _unwrap_optional(typing.get_args(tp)[0])
        if typing.get_origin(item) is Literal:
            item = str
        return {"type": parse_list(item if item in (int, float) else str), "metavar": "A,B,..."}
    if origin is dict:
        return {"type": parse_resource, "action": _DictAppend, "metavar": "NAME=AMOUNT"}
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return None
    return {"type": str}


def flag_name(model: type[BaseModel], name: str) -> str:
    extra = model.model_fields[name].json_schema_extra
    flag = extra.get("flag") if isinstance(extra, dict) else None
    return "--" + (flag or name.replace("_", "-"))


def _default_text(info: Any) -> str:
    if info.is_required():
        return ""
    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except TypeError:
            return ""
    else:
        value = info.default
    if value is None or value == {} or value == []:
        return ""
    if isinstance(value, bool):
        return " (default: on)" if value else " (default: off)"
    if isinstance(value, (list, tuple)):
        return f" (default {','.join(map(str, value))})"
    return f" (default {value})"


@dataclass
class FlagSet:
    """The flags one model contributed to a parser: ``dest -> field``."""

    model: type[BaseModel]
    group: Any
    dests: dict[str, str] = field(default_factory=dict)

    def values(self, args: argparse.Namespace) -> dict[str, Any]:
        """The fields the user set on the command line."""
        return {f: getattr(args, d) for d, f in self.dests.items() if getattr(args, d, None) is not None}


def add_model_flags(parser: argparse.ArgumentParser, model: type[BaseModel], title: str, *,
                    exclude: tuple[str, ...] = (), required: tuple[str, ...] = (),
                    help_overrides: dict[str, str] | None = None, show_defaults: bool = True) -> FlagSet:
    """Add one flag per scalar field of ``model`` to a new argument group; returns the mapping."""
    group = parser.add_argument_group(title)
    flags = FlagSet(model, group)
    for name, info in model.model_fields.items():
        if name in exclude:
            continue
        kwargs = _argparse_kwargs(info.annotation)
        if kwargs is None:
            continue
        flag = flag_name(model, name)
        dest = flag[2:].replace("-", "_")
        text = (help_overrides or {}).get(name) or (info.description or "").rstrip(".")
        kwargs = {**kwargs, "dest": dest, "default": None,
                  "help": (text + (_default_text(info) if show_defaults else "")).replace("%", "%%")}
        if name in required:
            kwargs["required"] = True
        group.add_argument(flag, **kwargs)
        flags.dests[dest] = name
    return flags


def build(model: type[BaseModel], values: dict[str, Any], what: str | None = None) -> Any:
    """``model(**values)``; a validation error becomes a ``ValueError`` in flag names."""
    try:
        return model(**values)
    except ValidationError as exc:
        prefix = f"{what}: " if what else ""
        raise ValueError(prefix + flag_errors(exc, model)) from None


def flag_errors(exc: ValidationError, model: type[BaseModel]) -> str:
    """Pydantic's errors in the words of the command line (flags, not field names)."""
    flags = {name: flag_name(model, name) for name in model.model_fields}
    parts = []
    for err in exc.errors():
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        for name, flag in flags.items():  # model-level checks name fields in their message
            if name not in ("engine", "model", "preset"):  # too common as plain words
                msg = re.sub(rf"(?<![-\w]){name}\b", flag, msg)
        loc = [str(p) for p in err.get("loc", ())]
        parts.append(f"{flags.get(loc[0], loc[0])}: {msg}" if loc else msg)
    return "; ".join(parts)
