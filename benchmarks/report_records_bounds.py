"""The report of a records output whose values are huge: page size and the report process's peak RSS.

    python -m benchmarks.report_records_bounds --out benchmarks/results/report_records_bounds.json \
        [--docs 10 --records 100 --chars 100000]

Writes a batch output of ``docs`` documents, each with ``records`` records of one type whose two
string values are ``chars`` characters long (the document's text holds every payer, so every
record has a span), then builds its report in a fresh process (:func:`pipelines.report.build_report`)
and reads that process's peak RSS. Headline keys: ``page_mb`` (MB = 10^6 bytes) and ``peak_rss_mb``
(MiB, the report process alone).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/report_records_bounds.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import loadavg, machine, print_table, write_json

SCHEMA = {"type": "object", "properties": {"payments": {"type": "array", "items": {"type": "object", "properties": {
    "payer": {"type": "string"}, "note": {"type": "string"}}}}}}


def write_output(root: Path, docs: int, records: int, chars: int) -> None:
    """A batch output with ``docs`` rows and their committed records (values of ``chars`` characters)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.extraction import schema_from
    from memagent.extraction.records import Evidence, Record
    from memagent.extraction import output_fields, record_items
    from pipelines.records_output import export_records

    root.mkdir(parents=True)
    schema = schema_from(SCHEMA)
    [record] = schema.record_types
    [column] = [f for f in output_fields(schema) if f.name == "records_payments"]
    rows, items = [], []
    for d in range(docs):
        payers = [f"{d}-{i}-" + "x" * chars for i in range(records)]
        text = "\n".join(payers)
        found = [Record("payments", {"payer": p, "note": "n" * chars},
                        {"payer": Evidence(0, text.index(p), text.index(p) + len(p))}, 1, 0, 0) for p in payers]
        rows.append({"id": f"d{d}", "context": text, "prediction": "{}", "steps": [], "error": None, "model": "m",
                     "config": json.dumps({"extraction": SCHEMA}), "extraction": "{}", "field_evidence": []})
        items.append(record_items(record, found))
    table = pa.Table.from_pylist(rows).append_column(column, pa.array(items, column.type))
    pq.write_table(table.set_column(table.column_names.index("error"), "error", pa.nulls(docs, pa.string())),
                   root / "part-0.parquet")
    export_records(str(root), None, ["payments"])


def report(root: Path) -> dict:
    """Build the report here (the child process) and measure it."""
    from pipelines.report import build_report

    page = Path(build_report(str(root), str(root.parent / "report.html")))
    return {"page_mb": round(page.stat().st_size / 1e6, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/report_records_bounds.json")
    ap.add_argument("--docs", type=int, default=10)
    ap.add_argument("--records", type=int, default=100)
    ap.add_argument("--chars", type=int, default=100_000)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(report(Path(args.child))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "out"
        write_output(root, args.docs, args.records, args.chars)
        child = subprocess.run([sys.executable, "-m", "benchmarks.report_records_bounds", "--child", str(root)],
                               check=True, capture_output=True, text=True)
        result = json.loads(child.stdout.strip().splitlines()[-1])
    out = {**result, "docs": args.docs, "records_per_doc": args.records, "value_chars": args.chars,
           "values_mb": round(2 * args.docs * args.records * args.chars / 1e6, 1), "load": loadavg(),
           "machine": machine()}
    write_json(args.out, out)
    print_table(["records", "values MB", "page MB", "peak RSS MiB"],
                [[args.docs * args.records, out["values_mb"], out["page_mb"], out["peak_rss_mb"]]])


if __name__ == "__main__":
    main()
