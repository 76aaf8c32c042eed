"""Flow ``extract-corpus``: the batch job with an extraction schema, plus per-field artifacts.

    [contract corpus if asked and absent] -> run the job (the batch-qa task, retries) -> artifacts

The same job as ``batch-qa`` (resume by ``id``, error rows, the Ray Data actor pool); the
``extraction`` parameter (a JSON Schema) makes it an extraction: one read per document for all fields, one
typed output column per field, each value with its evidence (memory step, char span). The
deployment ``extract-corpus/default`` (prefect.yaml) runs it on a generated contract corpus.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger

from flows.batch_qa import generate_then_run
from flows.params import DatasetURI, resolve_local
from flows.report import publish_report
from flows.stages import local_input
from memagent.config import JOB_PRESET, AgentConfig
from memagent.data.contracts import ANSWER_TOKENS, CONTRACT_SCHEMA, ContractCorpus
from memagent.engines import EngineConfig
from memagent.extraction import ExtractionSchema
from memagent.extraction.parse import iter_leaves
from pipelines.job import JobConfig
from pipelines.storage import S3Options

if TYPE_CHECKING:
    from pipelines.batch_config import BatchQAConfig

# Defaults of the deployment: a generated contract corpus (a flow task writes it if absent).
CONTRACTS_INPUT = "runs/contracts/docs"
CONTRACTS_OUTPUT = "runs/contracts/extractions"
# The `small` CPU budgets with an answer budget that holds the contract schema's JSON object.
EXTRACT_AGENT = AgentConfig(preset=JOB_PRESET, answer_tokens=ANSWER_TOKENS)


@task(name="ensure-contract-corpus", retries=1)
def ensure_contract_corpus(input: str, model: str, corpus: ContractCorpus) -> dict[str, Any]:
    """Write the generated contracts to ``input`` unless it already holds Parquet files."""
    from memagent.data.contracts import write_contracts

    path, existing = local_input(input)
    if existing:
        return {"generated": False, "files": existing}
    data, schema = write_contracts(path, corpus, model)
    get_run_logger().info("contract corpus: %d generated contracts -> %s (schema %s)", corpus.docs, data, schema)
    return {"generated": True, "rows": corpus.docs, "path": str(data)}


def _leaf_value(row: dict[str, Any], path: str) -> Any:
    """A row's value at a dotted leaf path (struct columns are dicts)."""
    value: Any = row
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def field_table(output: str, s3: S3Options, schema: ExtractionSchema) -> list[dict[str, Any]]:
    """Per field: rows with a value, rows without, and how many values have a document span."""
    from pipelines import storage

    fs, path = storage.filesystem(output, s3)
    files = storage.complete_parquet_files(fs, path)
    if not files:
        return []
    table = storage.read_columns(fs, files, ["error", *schema.names, "field_evidence"])
    rows = table.to_pylist()
    ok = [r for r in rows if r["error"] is None]
    out = []
    for path, f, _ in iter_leaves(schema.fields, {}):
        evidence = [e for r in ok for e in r["field_evidence"] or [] if e["field"] == path]
        filled = sum(_leaf_value(r, path) is not None for r in ok)
        out.append({"field": path, "kind": f.kind, "filled": filled,
                    "rows": len(ok), "values_with_span": sum(e["char_start"] is not None for e in evidence),
                    "values": len(evidence)})
    return out


def _records_cells(summary: dict[str, Any], require_grounding: bool) -> dict[str, Any]:
    """Record types: records written per type and what ``require_grounding`` dropped (no cells without them)."""
    if not summary.get("records"):
        return {}
    return {"records": ", ".join(f"{n} {name}" for name, n in summary["records"].items()),
            "grounding dropped": (f"{summary.get('dropped_values', 0)} values, {summary.get('dropped_records', 0)} "
                                  "records" if require_grounding else "off")}


@flow(name="extract-corpus", log_prints=True)
def extract_corpus(
    input: DatasetURI = CONTRACTS_INPUT,
    output: DatasetURI = CONTRACTS_OUTPUT,
    extraction: ExtractionSchema = ExtractionSchema(CONTRACT_SCHEMA),
    engine: EngineConfig = EngineConfig(),
    agent: AgentConfig = EXTRACT_AGENT,
    job: JobConfig = JobConfig(),
    s3: S3Options = S3Options(),
    corpus: ContractCorpus | None = None,
    redo_changed: bool = False,
    require_grounding: bool = False,
) -> dict[str, Any]:
    """Extract the fields of ``extraction`` from every document of a Parquet lake into typed columns.

    Args:
        input / output: Parquet lake (``id``, ``context``; a ``question`` column is not needed and
            passes through) and the output directory (local or s3://); reruns resume, and a
            changed schema on the same output is refused unless ``redo_changed``.
        extraction: the JSON Schema of the fields (memagent.extraction: string, number, integer,
            boolean, date, enum, array of strings; record types: arrays of objects, e.g.
            ``docs/schemas/statement.json``, written to ``OUTPUT/_records/<type>/``); checked before any work.
        require_grounding: record types only: drop record values not found in the document, and records
            whose key values are not, and count them (``AgentConfig.require_grounding``; set here, as
            the schema is, because ``agent`` holds no schema). (Named ``extraction``
            as in ``AgentConfig``: a parameter called ``schema`` would shadow pydantic's.)
        engine / agent / job / s3: model backend, budgets (must hold the fields: the check names
            the budget to raise), Ray job shape, S3 endpoint.
        corpus: when set and ``input`` (local) has no Parquet files, generate contracts there.
        redo_changed: re-extract (and replace) rows read with another schema, input or settings.
    """
    from pipelines.batch_qa import BatchQAConfig

    if agent.extraction is not None:
        raise ValueError("give the schema as the flow's extraction parameter, not inside agent")
    input, output = resolve_local(input), resolve_local(output)
    cfg = BatchQAConfig(  # budgets against the fields, cross-field checks: before any work
        input=input, output=output, s3=s3, engine=engine, agent=agent.with_overrides(extraction=extraction,
                                                                     require_grounding=require_grounding or None),
        job=job.model_copy(update={"progress": False}), redo_changed=redo_changed,
    )
    generate = None if corpus is None else functools.partial(ensure_contract_corpus, input, engine.model, corpus)
    summary = generate_then_run(cfg, generate, "contract corpus")

    fields = field_table(output, s3, extraction)
    publish_tables(cfg, summary, fields)
    summary["fields"] = fields
    summary["report"] = publish_report(output, key="extract-corpus-report", s3=s3, job_summary=summary)
    return summary


def publish_tables(cfg: BatchQAConfig, summary: dict[str, Any], fields: list[dict[str, Any]]) -> None:
    """The run's summary (rows, errors, tokens, budgets, records) and its per-field table as Prefect artifacts."""
    a, schema = cfg.agent, cfg.agent.extraction
    create_table_artifact(
        key="extract-corpus-summary",
        table=[{k: summary[k] for k in ("rows_in", "skipped", "rows_out", "error_rows", "infra_errors",
                                        "context_tokens", "seconds", "tokens_per_second")}
               | {"model": cfg.engine.model, "fields": ", ".join(schema.names),
                  "budgets": f"chunk {a.chunk_tokens} / memory {a.memory_tokens} / answer {a.answer_tokens}"}
               | _records_cells(summary, a.require_grounding)],
        description=f"Extraction {cfg.input} -> {cfg.output}: rows, errors (invalid_output among them), tokens read "
                    "a second.",
    )
    create_table_artifact(key="extract-corpus-fields", table=fields,
                          description="Per field: rows with a value, and values whose document span was found.")
