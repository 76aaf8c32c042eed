"""The HTML report at scale: file size and open time of a synthetic 10,000-row batch output.

    python -m benchmarks.report_scale --out benchmarks/results/report_scale.json [--rows 10000]

Writes a synthetic batch output (the real output schema; NIAH-like contexts of 2-12K chars,
2-6 memory steps of 20-60 words, 3% error rows, attribution columns filled), builds its
report with :func:`pipelines.report.build_report`, then opens it in headless Chromium.

Headline keys: ``size_mb`` (report file, MB = 2^20 bytes), ``open_seconds`` (median wall time
of a headless Chromium process that loads the page and screenshots it, minus the same for an
empty page: what the page itself costs), ``ready_ms`` (in-page: navigation start until the
row table is drawn, read from the page's ``data-ready-ms``) and ``row_ms`` (rendering one row's
timeline on demand, ``data-route-ms`` with ``#row=ID``). ``build_seconds``: writing the report.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python benchmarks/report_scale.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import loadavg, machine, print_table, write_json

WORDS = ("the city river number key value memory note fact lantern harbor falcon meadow comet quiet "
         "amber market bridge clock library train snow").split()


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` batch output rows with real-looking traces; about 3% are error rows."""
    from memagent.attribution import COLUMNS as ATTRIBUTION_COLUMNS, attribute
    from memagent.batch import RESULT_COLUMNS

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        ans = str(rng.randint(1_000_000, 9_999_999))
        words = [rng.choice(WORDS) for _ in range(rng.randint(400, 2400))]
        at = rng.randrange(len(words))
        context = " ".join(words[:at] + [f"The special magic number is {ans}."] + words[at:])
        pos = context.index(ans)
        k = rng.randint(2, 6)
        bounds = [0, *sorted(rng.sample(range(1, len(context)), k - 1)), len(context)]
        steps, memory = [], ""
        for j in range(k):
            memory = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
            kept = bool(steps) and ans in steps[-1]["memory"] and rng.random() < 0.8
            if bounds[j] <= pos < bounds[j + 1] or kept:
                memory += f" The number is {ans}."
            steps.append({"step": j, "kind": "memory", "chunk_index": j, "char_start": bounds[j],
                          "char_end": bounds[j + 1], "memory": memory, "prompt_tokens": 600,
                          "completion_tokens": 70, "finish_reason": "stop", "seconds": 0.8})
        prediction = ans if ans in memory else rng.choice(WORDS)
        steps.append({"step": k, "kind": "answer", "chunk_index": None, "char_start": None, "char_end": None,
                      "memory": memory, "prompt_tokens": 120, "completion_tokens": 9, "finish_reason": "stop",
                      "seconds": 0.2})
        row = {"id": f"row-{i:05d}", "question": "What is the special magic number mentioned in the text?",
               "context": context, "answers": [ans], "prediction": prediction, "response": f"Answer: {prediction}",
               "memory": memory, "n_chunks": k, "context_tokens": len(context) // 4, "truncated": False,
               "steps": steps, "score": float(prediction == ans), "error": None, "model": "synthetic",
               "config": json.dumps({"chunk_tokens": 512, "memory_tokens": 128}), "seconds": 4.0,
               "method": "memagent", **attribute(steps, prediction, [ans], context).columns()}
        if rng.random() < 0.03:
            row.update({c: None for c in RESULT_COLUMNS}, **dict.fromkeys(ATTRIBUTION_COLUMNS), model="synthetic",
                       error=rng.choice(["input: context is empty (only whitespace): there is nothing to read",
                                         f"agent: RuntimeError: engine died on request {i}"]))
        rows.append(row)
    return rows


def write_output(rows: list[dict], out_dir: Path, per_file: int = 1000) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.batch import RESULT_SCHEMA

    schema = pa.schema([("id", pa.string()), ("question", pa.string()), ("context", pa.string()),
                        ("answers", pa.list_(pa.string())), *RESULT_SCHEMA])
    out_dir.mkdir(parents=True, exist_ok=True)
    for n, start in enumerate(range(0, len(rows), per_file)):
        table = pa.Table.from_pylist(rows[start:start + per_file], schema=schema)
        pq.write_table(table, out_dir / f"part-{n:03d}.parquet")


def _attr(dom: str, name: str) -> float:
    m = re.search(rf'<body[^>]*data-{name}="([\d.]+)"', dom)
    return float(m.group(1)) if m else float("nan")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/report_scale.json")
    args = p.parse_args(argv)

    from pipelines.report import build_report
    from infra.report_browser import find_chromium, open_page

    with tempfile.TemporaryDirectory(prefix="report-scale-") as tmp:
        run = Path(tmp) / "answers"
        t0 = time.perf_counter()
        write_output(synthetic_rows(args.rows), run)
        gen_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        page = Path(build_report(str(run)))
        build_s = time.perf_counter() - t0
        size = page.stat().st_size
        result = {"rows": args.rows, "size_mb": round(size / 2**20, 2), "size_bytes": size,
                  "bytes_per_row": round(size / args.rows), "build_seconds": round(build_s, 2),
                  "generate_seconds": round(gen_s, 2),
                  "parquet_mb": round(sum(f.stat().st_size for f in run.glob("*.parquet")) / 2**20, 1)}
        binary = find_chromium()
        if binary:
            empty = Path(tmp) / "empty.html"
            empty.write_text("<!DOCTYPE html><html><body>empty</body></html>")
            base, opens, ready, table, rows_ms = [], [], [], [], []
            shot = Path(tmp) / "shot.png"
            for _ in range(args.repeats):
                # Wall time to load and paint (a screenshot; a DOM dump would also time serialising 20 MB).
                base.append(open_page(empty, budget_ms=None, screenshot=shot).seconds)
                opens.append(open_page(page, budget_ms=None, screenshot=shot).seconds)
                run_ = open_page(page, budget_ms=None)
                ready.append(_attr(run_.dom, "ready-ms"))
                table.append(_attr(run_.dom, "table-ms"))
                rows_ms.append(_attr(open_page(page, fragment="row=row-00007", budget_ms=None).dom, "route-ms"))
            result.update(
                open_seconds=round(statistics.median(opens) - statistics.median(base), 2),
                browser_process_seconds=round(statistics.median(opens), 2),
                empty_page_seconds=round(statistics.median(base), 2), ready_ms=round(statistics.median(ready)),
                table_ms=round(statistics.median(table)), row_ms=round(statistics.median(rows_ms)),
                raw={"open": opens, "empty": base, "ready_ms": ready, "table_ms": table, "row_ms": rows_ms},
                browser=binary)
        else:
            result["browser"] = None  # no Chromium: sizes only
    result.update(command=f"python -m benchmarks.report_scale --rows {args.rows} --out {args.out}",
                  machine=machine(), loadavg_end=loadavg())
    write_json(args.out, result)
    print_table(["rows", "size MB", "build s", "open s", "ready ms", "row ms"],
                [[args.rows, result["size_mb"], result["build_seconds"], result.get("open_seconds"),
                  result.get("ready_ms"), result.get("row_ms")]])
    return result


if __name__ == "__main__":
    main()
