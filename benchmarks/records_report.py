"""The record-extraction benchmark's summaries and printed tables (used by :mod:`benchmarks.records`)."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.common import print_table


def wilson(k: int, n: int) -> dict[str, Any]:
    """A rate ``k / n`` with its Wilson 95% interval (``rate`` None when ``n`` is 0)."""
    from memagent.evaluate import wilson_interval

    if not n:
        return {"rate": None, "ci95": None, "k": 0, "n": 0}
    lo, hi = wilson_interval(k / n, n)
    return {"rate": round(k / n, 4), "ci95": [round(lo, 4), round(hi, 4)], "k": k, "n": n}


def scripted_summary(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """The scripted part over its scored documents: recall, precision, losses, and the largest one's costs."""
    small, big = min(ok, key=lambda r: r["document_tokens"]), max(ok, key=lambda r: r["document_tokens"])
    tot = {k: sum(r["score"][k] for r in ok) for k in ("gold", "predicted", "true_positive")}
    return {
        "recall": round(tot["true_positive"] / tot["gold"], 4),
        "precision": round(tot["true_positive"] / tot["predicted"], 4),
        "records_gold": tot["gold"],
        "records_lost_to_truncation_failed_pieces": sum(r["record_failed_pieces"] for r in ok),
        "records_calls_cut_at_budget_then_split": sum(r["calls"]["records_cut_at_budget"] for r in ok),
        "missed_with_a_planted_line_cut_by_chunk_boundary": sum(r["score"].get("missed_with_a_cut_line", 0)
                                                                for r in ok),
        "peak_rss_mb": {str(r["document_tokens"]): r["peak_rss_mb"] for r in ok},
        "peak_rss_ratio_largest_vs_smallest": round(big["peak_rss_mb"] / small["peak_rss_mb"], 3),
        "records_cost_vs_memory_update": big["records_cost_vs_memory_update"],
        "records_cost_vs_memory_update_with_prefix_sharing": big["records_cost_vs_memory_update_with_prefix_sharing"],
        "prompt_tokens_beyond_template_per_document_token": big["prompt_tokens_beyond_template_per_document_token"],
    }


def model_summary(m: dict[str, Any], docs_asked: int, threads: int, max_batch: int) -> dict[str, Any]:
    """The model part's figures over the documents it read, each rate with its Wilson interval."""
    ds = m.get("docs", [])
    g, tp, pr = (sum(d["score"][k] for d in ds) for k in ("gold", "true_positive", "predicted"))
    am = [sum(d["score"]["amount_exact"][i] for d in ds) for i in (0, 1)]
    bk = [sum(d["score"]["bank_exact"][i] for d in ds) for i in (0, 1)]
    gr = [sum(d["score"]["grounded"][i] for d in ds) for i in (0, 1)]
    return {
        "model": "smollm2-135m fp32", "threads": threads, "max_batch": max_batch,
        "config": {"chunk_tokens": 512, "memory_tokens": m.get("memory_tokens", 128),
                   "records_reply_budget": m.get("memory_tokens", 128), "answer_tokens": 48,
                   "min_split_chars": m.get("min_split_chars")},
        "partial": len(ds) < docs_asked, "docs_read": len(ds), "docs_asked": docs_asked,
        "schema_valid_rate": wilson(m.get("records_calls_valid", 0), m.get("records_calls", 0)),
        "recall": wilson(tp, g), "precision": wilson(tp, pr), "amount_exact_match": wilson(*am),
        "bank_exact_match": wilson(*bk), "grounded_fraction": wilson(*gr)}


def print_summary(out: dict[str, Any]) -> None:
    """Print the scripted part's table, each model part's, and the LangExtract peer's figures."""
    rows = []
    for r in out.get("scripted", {}).get("documents", []):
        if "score" not in r:
            rows.append([r.get("target_tokens"), "error", "", "", "", "", "", "", ""])
            continue
        s = r["score"]
        rows.append([r["document_tokens"], r["chunks"], s["gold"], s["recall"], s["precision"], r["record_splits"],
                     r["record_failed_pieces"], r["peak_rss_mb"], r["records_cost_vs_memory_update"],
                     r["prompt_tokens_beyond_template_per_document_token"]["memory_updates"], r["wall_s"],
                     r["loadavg_before"][0]])
    print("scripted test double (measures the pipeline, not a model)")
    print_table(["doc tokens", "chunks", "gold", "recall", "precision", "splits", "failed", "peak RSS MB",
                 "records/memory tokens", "doc-token ratio (memory)", "wall s", "load"], rows)
    for key in [k for k in out if k.startswith("model")]:
        m = out[key].get("summary")
        if not m:
            continue
        print(key)
        print_table(["model", "docs", "schema-valid", "recall", "precision", "amount EM", "grounded"],
                    [[m["model"], f"{m['docs_read']}/{m['docs_asked']}", m["schema_valid_rate"]["rate"],
                      m["recall"]["rate"], m["precision"]["rate"], m["amount_exact_match"]["rate"],
                      m["grounded_fraction"]["rate"]]])
    print("langextract:", json.dumps({k: v for k, v in out.get("langextract", {}).items()
                                      if k not in ("docs", "documents")})[:600])
