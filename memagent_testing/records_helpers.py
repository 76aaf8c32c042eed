"""A scripted engine for record extraction: it answers a records call by reading the planted sentences
of the passage it is shown (a test double: it measures the pipeline, not a model).

Planted sentence (one per line): ``Acme Ltd paid 1250 on 2021-03-14 via Northbank.`` (``via`` optional).
"""

from __future__ import annotations

import json
import re

from memagent.config import AgentConfig
from memagent.data.records_corpus import SCHEMA  # the statement corpus's record type
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams

CONFIG = AgentConfig(chunk_tokens=64, memory_tokens=96, answer_tokens=32, query_tokens=200, extraction=SCHEMA)

PLANTED = re.compile(r"([A-Z][A-Za-z]* Ltd) paid (\d+) on (\d{4}-\d{2}-\d{2})(?: via (\w+))?\.")
FILLER = "The weather was mild that week and nothing else of note happened in the office."


def payment(payer: str, amount: int, date: str, bank: str | None = None) -> str:
    return f"{payer} paid {amount} on {date}" + (f" via {bank}" if bank else "") + "."


def document(*parts: list[str], filler: int = 3) -> str:
    """Lines: each part's sentences, then ``filler`` filler lines (parts land in different chunks)."""
    lines: list[str] = []
    for part in parts:
        lines += part + [FILLER] * filler
    return "\n".join(lines)


def planted(text: str) -> list[dict]:
    out = []
    for m in PLANTED.finditer(text):
        rec = {"payer": m.group(1), "date": m.group(3), "amount": int(m.group(2))}
        if m.group(4):
            rec["bank"] = {"name": m.group(4)}
        out.append(rec)
    return out


def section(content: str) -> str:
    return content.split("<section>\n", 1)[1].rsplit("\n</section>", 1)[0]


class RecordsEngine(Engine):
    """Memory calls: "mem"; records calls: the planted payments of the passage, as JSON; final: ``{}``-ish.

    ``max_records``: a records reply listing more is cut as a reply at ``max_tokens`` would be
    (``finish_reason`` "length", invalid JSON): the split-and-reread path. ``calls`` logs
    ``(kind, prompt, params)`` for every call.
    """

    def __init__(self, tokenizer, max_records: int | None = None):
        self.name, self.context_window, self.tokenizer, self.stats = "records-double", 4096, tokenizer, EngineStats()
        self.max_records = max_records
        self.calls: list[tuple[str, str, SamplingParams]] = []

    async def chat(self, messages, params: SamplingParams) -> Completion:
        content = messages[-1]["content"]
        if "Reply with a JSON array of the payments" in content:
            found = planted(section(content))
            text = json.dumps(found)
            self.calls.append(("records", content, params))
            if self.max_records is not None and len(found) > self.max_records:
                return Completion(text=text[: len(text) // 2], prompt_tokens=50, completion_tokens=params.max_tokens,
                                  finish_reason="length")
            return Completion(text=text, prompt_tokens=50, completion_tokens=len(text) // 4, finish_reason="stop")
        if "Updated memory:" in content:
            self.calls.append(("memory", content, params))
            return Completion(text="mem", prompt_tokens=50, completion_tokens=1, finish_reason="stop")
        self.calls.append(("answer", content, params))
        return Completion(text='{"holder": "Jane Roe"}', prompt_tokens=20, completion_tokens=5, finish_reason="stop")


def records_engine(config: dict, engine_config=None) -> RecordsEngine:
    """Bound with functools.partial: the batch job's ``build_engine`` (runs inside the Ray actor)."""
    from transformers import AutoTokenizer

    return RecordsEngine(AutoTokenizer.from_pretrained(config["tokenizer"]), config.get("max_records"))


def write_documents(root: str, schema, docs: list[tuple[str, dict[str, list]]], name: str = "block-0.parquet",
                    extra: list[dict] | None = None, **write_options) -> None:
    """A documents file as the batch job commits it (each document's records in its ``records_<type>``
    columns, typed as ``output_fields`` types them), then each type's records dataset exported from it.
    ``docs``: (id, records by type); ``extra``: each row's other columns (the report's; types inferred)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.extraction import output_fields, record_items
    from memagent.result_schema import RECORDS_PREFIX
    from pipelines.records_output import export_records

    table = pa.Table.from_pylist([{**(extra[i] if extra else {}), "id": doc} for i, (doc, _) in enumerate(docs)])
    if "error" not in table.column_names:
        table = table.append_column("error", pa.nulls(len(docs), pa.string()))
    for field in output_fields(schema):
        if field.name.startswith(RECORDS_PREFIX):
            record = next(r for r in schema.record_types if RECORDS_PREFIX + r.name == field.name)
            items = [record_items(record, found.get(record.name, [])) for _, found in docs]
            table = table.append_column(field, pa.array(items, field.type))
    pq.write_table(table, f"{root}/{name}", **write_options)
    export_records(root, None, [r.name for r in schema.record_types])
