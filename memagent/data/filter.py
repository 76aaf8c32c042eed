"""The no-context filter: drop questions a model answers without reading anything.

Each distinct question goes to every engine ``k`` times, bare (the question plus a request for
a ``\\boxed{}`` answer), sampled at temperature 1.0 / top-p 0.7 with 512 new tokens as the
paper did. A response is a hit if the strict boxed verifier accepts it **or** any gold answer
appears anywhere in it; one hit drops the question ("answerable at best-of-k"). All requests
go through the async engine interface at once (bounded by ``max_in_flight``), so the
transformers engine batches them on CPU and vLLM on GPU.

Rows are never lost: kept rows get ``filter_reason = None``; dropped rows get the reason, and
a row whose requests failed is dropped with ``filter_reason = "error: …"``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from memagent.engines import EngineConfig, make_engine
from memagent.engines.base import Engine, Messages, SamplingParams
from memagent.verify import boxed_em, contains_any

log = logging.getLogger(__name__)

NO_CONTEXT_PROMPT = "{question}\n\nGive only your final answer, written inside \\boxed{{}}."

# Columns the filter adds to every row.
FILTER_FIELDS = [
    pa.field("filter_hits", pa.list_(pa.string())),
    pa.field("filter_reason", pa.string()),
]
RESPONSES_FIELD = pa.field("filter_responses", pa.list_(pa.string()))


def no_context_messages(question: str) -> Messages:
    """The bare-question conversation (one user turn)."""
    return [{"role": "user", "content": NO_CONTEXT_PROMPT.format(question=question)}]


@dataclass(frozen=True)
class Attempt:
    """One sampled response and how the two checks scored it."""

    engine: str
    sample: int
    text: str
    boxed: bool
    contains: bool

    @property
    def hit(self) -> bool:
        return self.boxed or self.contains

    def label(self) -> str:
        checks = "+".join(name for name, ok in (("boxed", self.boxed), ("contains", self.contains)) if ok)
        return f"{self.engine}#{self.sample}:{checks}"


@dataclass
class FilterResult:
    """Rows in input order, split; each carries ``filter_hits`` and ``filter_reason``."""

    kept: list[dict] = field(default_factory=list)
    dropped: list[dict] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.dropped if (r.get("filter_reason") or "").startswith("error:"))

    def summary(self) -> dict[str, Any]:
        total = len(self.kept) + len(self.dropped)
        return {"rows": total, "kept": len(self.kept), "dropped": len(self.dropped), "errors": self.errors,
                "drop_rate": len(self.dropped) / total if total else 0.0}


def _answers(row: dict, where: str) -> list[str]:
    answers = row.get("answers")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, (list, tuple)) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise ValueError(f"{where}: field 'answers' must be a non-empty list of non-empty strings, got {answers!r}")
    return list(answers)


def _validate(rows: Sequence[dict]) -> list[tuple[str, list[str]]]:
    keys = []
    for i, row in enumerate(rows):
        where = f"row {i}" + (f" (id={row.get('id')!r})" if isinstance(row, dict) and "id" in row else "")
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(row).__name__}")
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: field 'question' is missing or empty")
        keys.append((question.strip(), _answers(row, where)))
    return keys


async def probe(
    question: str,
    answers: Sequence[str],
    engines: Sequence[Engine],
    params: SamplingParams,
    k: int,
) -> list[Attempt]:
    """Ask every engine the bare question ``k`` times (concurrently) and score each response."""
    messages = no_context_messages(question)
    calls = [(e, s) for e in engines for s in range(k)]
    completions = await asyncio.gather(*(e.chat(messages, params) for e, _ in calls))
    return [
        Attempt(e.name, s, c.text, bool(boxed_em(c.text, answers)), bool(contains_any(c.text, answers)))
        for (e, s), c in zip(calls, completions)
    ]


async def filter_no_context(
    rows: Iterable[dict],
    engines: Sequence[Engine],
    *,
    k: int = 2,
    max_tokens: int = 512,
    temperature: float = 1.0,
    top_p: float = 0.7,
    max_in_flight: int = 64,
    keep_responses: bool = False,
) -> FilterResult:
    """Split ``rows`` (each with ``question`` and ``answers``) into kept and dropped.

    Identical (question, answers) pairs are asked once and share the verdict, so a set with
    several sizes of the same question costs one probe per question. ``max_in_flight`` bounds
    the questions in flight (each holds ``len(engines) * k`` requests). With
    ``keep_responses`` every row also gets ``filter_responses`` (all raw responses).
    """
    rows = list(rows)
    if not engines:
        raise ValueError("the filter needs at least one engine")
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p)
    keys = _validate(rows)
    unique = list(dict.fromkeys((q, tuple(a)) for q, a in keys))
    gate = asyncio.Semaphore(max_in_flight)

    async def one(q: str, a: tuple[str, ...]) -> list[Attempt] | BaseException:
        async with gate:
            try:
                return await probe(q, a, engines, params, k)
            except Exception as exc:  # one bad question must not stop the set
                log.warning("no-context probe failed for %r: %s", q[:80], exc)
                return exc

    verdicts = dict(zip(unique, await asyncio.gather(*(one(q, a) for q, a in unique))))
    result = FilterResult()
    for row, (q, a) in zip(rows, keys):
        out, dropped = judged_row(row, verdicts[(q, tuple(a))], keep_responses)
        (result.dropped if dropped else result.kept).append(out)
    return result


def judged_row(row: dict, verdict: list[Attempt] | BaseException, keep_responses: bool) -> tuple[dict, bool]:
    """``row`` with the filter's columns (``filter_hits``, ``filter_reason``, and with ``keep_responses`` the
    responses), and whether it is dropped: answered without context, or its probe failed."""
    out = dict(row)
    if isinstance(verdict, BaseException):
        out.update(filter_hits=[], filter_reason=f"error: {type(verdict).__name__}: {verdict}")
        if keep_responses:
            out["filter_responses"] = []
        return out, True
    hits = [att.label() for att in verdict if att.hit]
    out["filter_hits"] = hits
    out["filter_reason"] = f"answered without context ({', '.join(hits)})" if hits else None
    if keep_responses:
        out["filter_responses"] = [att.text for att in verdict]
    return out, bool(hits)


def output_schema(input_schema: pa.Schema, keep_responses: bool = False) -> pa.Schema:
    """The input's columns (minus any earlier filter columns) plus the filter's."""
    names = {f.name for f in FILTER_FIELDS} | {RESPONSES_FIELD.name}
    fields = [f for f in input_schema if f.name not in names] + FILTER_FIELDS
    return pa.schema(fields + ([RESPONSES_FIELD] if keep_responses else []))


class FilterConfig(BaseModel):
    """The no-context filter: drop questions a model answers without the document."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[str] = Field(default_factory=list, description="Models to ask, with the engine's other settings "
                              "(default: the engine's model)")
    k: int = Field(2, gt=0, description="Samples per model (best-of-k)")
    max_tokens: int = Field(512, gt=0, description="New tokens per probe (paper: 512)")
    temperature: float = Field(1.0, ge=0, description="Probe sampling temperature")
    top_p: float = Field(0.7, gt=0, le=1, description="Probe nucleus mass")
    max_keep: int | None = Field(None, gt=0, description="Keep at most the first N survivors "
                                 "(paper: 8192 train, 128 dev)")
    keep_responses: bool = Field(False, description="Store every raw response in filter_responses")


def run_filter(rows: list[dict], schema: pa.Schema, cfg: FilterConfig, engine: EngineConfig, output: str,
               dropped: str) -> dict[str, Any]:
    """The filter stage: probe with every model on ``engine``'s backend, write kept and dropped rows.

    Returns the summary (counts, models, output paths).
    """
    from memagent.data.io import write_parquet

    models = cfg.models or [engine.model]
    engines = [make_engine(engine.model_copy(update={"model": m})) for m in models]

    async def run_then_close() -> FilterResult:
        try:
            return await filter_no_context(rows, engines, k=cfg.k, max_tokens=cfg.max_tokens,
                                           temperature=cfg.temperature, top_p=cfg.top_p,
                                           keep_responses=cfg.keep_responses)
        finally:
            for e in engines:
                await e.close()

    result = asyncio.run(run_then_close())
    kept = result.kept if cfg.max_keep is None else result.kept[: cfg.max_keep]
    out_schema = output_schema(schema, cfg.keep_responses)
    return {**result.summary(), "written_kept": len(kept), "models": models, "k": cfg.k,
            "output": write_parquet(kept, output, out_schema),
            "dropped_output": write_parquet(result.dropped, dropped, out_schema)}
