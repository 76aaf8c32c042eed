"""The input files' schemas: each file's read (a file that is not Parquet named), then merged into
one, widening compatible types and naming the column and both files when they disagree. Done once,
before any work, so a bad or inconsistent input fails the job up front instead of in a Ray task.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.data.io import is_s3


def read_schemas(fs: pafs.FileSystem, files: list[str], uri: str) -> list[tuple[str, pa.Schema]]:
    """Each input file's schema; a file that is not Parquet (or is cut short) is named."""
    out = []
    for file in files:
        try:
            with fs.open_input_file(file) as f:
                out.append((file, pq.read_schema(f)))
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, pa.ArrowInvalid) and "Parquet" not in str(exc):
                raise
            shown = file if not is_s3(uri) else "s3://" + file
            raise ValueError(f"input file {shown} is not a readable Parquet file "
                             f"({' '.join(str(exc).split()).replace(chr(39) + '<Buffer>' + chr(39), 'it')})") from None
    return out


def unify_schemas(schemas: list[tuple[str, pa.Schema]], uri: str) -> pa.Schema:
    """One schema for all input files: columns of every file kept (nulls where a file lacks one),
    compatible types widened (int32 + int64 -> int64, int + float -> double, string + large_string);
    incompatible types are an error naming the column and both files."""
    fields: dict[str, tuple[pa.DataType, str]] = {}
    for file, schema in schemas:
        for f in schema:
            if f.name not in fields:
                fields[f.name] = (f.type, file)
                continue
            have, first = fields[f.name]
            if have == f.type:
                continue
            try:
                merged = pa.unify_schemas([pa.schema([(f.name, have)]), pa.schema([(f.name, f.type)])],
                                          promote_options="permissive").field(f.name).type
            except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
                s3 = "s3://" if is_s3(uri) else ""
                raise ValueError(f"input column {f.name!r} is {have} in {s3}{first} but {f.type} in {s3}{file}: the "
                                 "files disagree; cast the column to one type in every file") from None
            fields[f.name] = (merged, first)
    return pa.schema([(name, t) for name, (t, _) in fields.items()])
