"""Public extraction schemas end to end with the packaged model and the job's default flags (issue 64).

`nice python -m benchmarks.public_schemas --schemas PATH/extractbench-schemas` runs `memagent batch
--schema FILE` with no other flag (the packaged SmolLM2-135M-Instruct on the hf engine, budgets derived from
the schema) once per case, each over one document this script writes:

- `filing`: the 10-Q schema (`10kq-schema.json`: `meta` and four statements of 52 lists of one shared
  metric, 369 leaves) over one generated filing (`memagent synth filings`, seed 0, no filler);
- `resume`: the résumé schema (`resume-schema.json`, wrapped under `schema_definition`; `skills` is an
  array | object union) over a one-page résumé whose skills are grouped under headings;
- `swimming`: the results-table schema (`swimming-schema.json`: age groups holding result rows) over one
  results page.

Every output row is checked: its `error`, and its `extraction` validated against the schema file as given
(jsonschema, the wrapper unwrapped). A 135M model's values are not gold; this shows every row completes
and is valid. Writes `results/public_schemas.json` and `.md` (the schemas are MIT, not in this repo).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from benchmarks.common import machine, table, write_json
from memagent.data.filings import filing
from memagent.extraction.schema_files import unwrapped

RESUME = """\
Dr. Elena Marquez
Senior Data Engineer
elena.marquez@example.org | +34 612 555 019 | https://www.linkedin.com/in/elena-marquez-data
https://github.com/emarquez

Profile
Data engineer with nine years of experience building batch pipelines for public-sector statistics.

Technical Skills: Python, SQL, Apache Spark, Ray, Parquet
Cloud Platforms: AWS S3, Google Cloud Storage
Research Interests: record linkage, data quality

Experience
Lead Data Engineer, Instituto de Datos Abiertos, Madrid (March 2021 - present)
Leads a team of five; moved the census linkage pipeline from nightly scripts to a scheduled Ray job.

Data Engineer, Nordlys Analytics, Oslo (2017 - 2021)
Built ingestion for 40 municipal data sources and the quality checks that gate their release.

Teaching Assistant, Universidad de Sevilla (2015 - 2017)
Taught the databases laboratory to second-year students.

Education
MSc Computer Science, Universidad Politecnica de Madrid, 2013 - 2015. Thesis on probabilistic record linkage.
BSc Mathematics, Universidad de Sevilla, 2009 - 2013.

Publications
E. Marquez, T. Berg. "Blocking keys for census linkage at scale". Journal of Official Statistics, 2022.
E. Marquez. "Quality gates for open data releases". Proceedings of DataEng Europe, 2020.

Languages: Spanish (native), English (fluent), Norwegian (intermediate)
"""

SWIMMING = """\
Nordic Masters Swimming Championships 2025, Bergen
Results: Men's 100m Breaststroke, Long Course (50 m)

Age group 30-34
Rank  Athlete            YoB   Team                  Country  Time     Records
1     Jonas Berg         1993  Bergen Svommeklubb    NOR      1:04.82  CR
2     Mikael Lindqvist   1991  Malmo Kappsim         SWE      1:06.15
3     Pekka Virtanen     1994  Helsingin Uimarit     FIN      1:07.40
DSQ   Anders Holm        1992  Aarhus Svomning       DEN      -

Age group 35-39
Rank  Athlete            YoB   Team                  Country  Time     Records
1     Olafur Jonsson     1988  Sundfelag Reykjavik   ISL      1:08.03  NR
2     Henrik Dahl        1987  Stavanger Svomme      NOR      1:09.91
3     Erik Sundberg      1989  Goteborg Sim          SWE      1:10.27
"""


def _cases(schemas: Path) -> dict[str, tuple[Path, str]]:
    return {
        "filing": (schemas / "10kq-schema.json", filing(seed=0, filler=0)["text"]),
        "resume": (schemas / "resume-schema.json", RESUME),
        "swimming": (schemas / "swimming-schema.json", SWIMMING),
    }


def _tree_rss(pid: int, peak: list[int], done: threading.Event) -> None:
    """The peak resident memory of a process and its children (Ray's workers), sampled every 0.5 s."""
    while not done.is_set():
        try:
            proc = psutil.Process(pid)
            procs = [proc, *proc.children(recursive=True)]
            peak[0] = max(peak[0], sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        done.wait(0.5)


def _errors(schema: dict, extraction: str | None) -> list[str]:
    import jsonschema

    if extraction is None:
        return ["no extraction"]
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.path)) or '(root)'}: {e.message[:120]}"
            for e in validator.iter_errors(json.loads(extraction))]


def run_case(name: str, schema_path: Path, text: str, work: Path) -> dict:
    """`memagent batch --schema schema_path` with no other flag over one document; the row's figures."""
    inp, out = work / f"{name}.parquet", work / f"out-{name}"
    pq.write_table(pa.table({"id": [name], "context": [text]}), inp)
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(inp), "--output", str(out),
           "--schema", str(schema_path)]
    peak, done = [0], threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = threading.Thread(target=_tree_rss, args=(proc.pid, peak, done), daemon=True)
    sampler.start()
    log, _ = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    result = {"case": name, "schema": schema_path.name, "exit": proc.returncode, "wall_s": round(wall, 1),
              "command": f"memagent batch --input {inp.name} --output {out.name} --schema {schema_path.name}",
              "peak_rss_mib": peak[0] >> 20}
    if proc.returncode != 0:
        return {**result, "log_tail": log[-2000:]}
    rows = ds.dataset(out, format="parquet", ignore_prefixes=["_", "."]).to_table().to_pylist()
    schema = unwrapped(json.loads(schema_path.read_text()))
    row = rows[0]
    steps = row.get("steps") or []
    result.update({
        "rows": len(rows), "error_rows": sum(r.get("error") is not None for r in rows), "error": row.get("error"),
        "context_chars": len(text), "n_chunks": row.get("n_chunks"), "calls": len(steps),
        "prompt_tokens": sum(s["prompt_tokens"] or 0 for s in steps),
        "completion_tokens": sum(s["completion_tokens"] or 0 for s in steps),
        "record_calls": row.get("record_calls"), "schema_errors": row.get("schema_errors"),
        "values_cut": row.get("values_cut"), "extraction": row.get("extraction"),
        "invalid_under_schema": _errors(schema, row.get("extraction")),
    })
    result["valid"] = not result["invalid_under_schema"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schemas", type=Path, required=True, help="the ExtractBench schemas folder")
    ap.add_argument("--only", default="filing,resume,swimming", help="comma-separated cases")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/public_schemas.json"))
    args = ap.parse_args()
    cases = _cases(args.schemas)
    before = machine()
    with tempfile.TemporaryDirectory(prefix="public-schemas-") as tmp:
        results = [run_case(n, *cases[n], Path(tmp)) for n in args.only.split(",")]
    write_json(args.out, {"machine_before": before, "machine_after": machine(), "cases": results})
    header = ["case", "schema", "chunks", "calls", "record calls", "prompt tokens", "error", "valid", "values cut",
              "wall s", "peak RSS MiB"]
    rows = [[r["case"], r["schema"], r.get("n_chunks"), r.get("calls"), r.get("record_calls"),
              r.get("prompt_tokens"), r.get("error") or ("none" if r["exit"] == 0 else f"exit {r['exit']}"),
              r.get("valid"), len(r.get("values_cut") or []), r["wall_s"], r["peak_rss_mib"]] for r in results]
    text = table(header, rows)
    args.out.with_suffix(".md").write_text(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
