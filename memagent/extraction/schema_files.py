"""Schema files and models by name: what ``--schema FILE|module:Model`` reads, checked on load.

A file is read with a bound whatever it is (a device's size reads 0), and a file that wraps its schema under one
key (OpenAI's ``response_format`` object, ExtractBench's ``schema_definition``) is read as the schema it wraps.
Every problem is a one-line ``ValueError`` naming the file or model.
"""

from __future__ import annotations

import json
import re
from os import PathLike
from pathlib import Path
from typing import Any

from memagent.extraction.model_check import load_model
from memagent.extraction.parse import MAX_DEPTH, MAX_SCHEMA_CHARS
from memagent.extraction.schema import ExtractionSchema, schema_from

# A schema file is read up to this many bytes (JSON text may spend 4 bytes on a character of the schema).
MAX_SCHEMA_FILE_BYTES = 4 * MAX_SCHEMA_CHARS


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
