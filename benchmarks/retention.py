"""Retention, capture and accuracy of a memory of K heads, K in {1, 2, 4} at equal memory_tokens.

    python -m benchmarks.retention --out benchmarks/results/retention.json \\
        [--lengths 16384 32768] [--n 50] [--model-lengths 16384] [--model-n 4] [--model-batch 16] [--writers keep_all newest smollm2]

Documents: RULER ``niah_multivalue`` (four needles of one key, each at its own depth) sized in the
packaged model's tokenizer, the haystack the packaged SQuAD sample's paragraphs (no download).
Evidence: the four values where the context states them (:func:`memagent.retention.ruler_evidence`).

Writers, each reading every document with the ``small`` budgets (chunk 1024, memory 160 tokens):

- ``keep_all`` (scripted): the head it rewrites keeps its old text and adds the section's needles
  (``key: value``), cut at the step's token budget: retention must read 100%;
- ``newest`` (scripted): the head it rewrites holds only the section's needles (a writer that
  rewrites the whole memory and keeps only the newest): with K = 1 only the last chunk's needles
  survive, with K heads the last K chunks': retention falls with length;
- ``smollm2`` (the packaged SmolLM2-135M on CPU, greedy): fewer documents (``--model-n``), each
  K's documents read concurrently (the engine batches them).

A scripted writer's final answer lists every 7-digit number in the memory; accuracy is RULER's
``string_match_all`` against the four values. Per (writer, length, K), over every needle read:
capture (captured / read), retention (retained / captured), end to end (retained / read); accuracy,
decoded tokens per memory step, wall seconds per document (a K's documents read concurrently: the
cell's wall / n), and a timeline drawing of the first document (``<out stem>_<writer>_<len>k_K<k>.png``).
A needle cut in two by a chunk boundary is in neither section whole: the scripted writers never
capture it (capture < 100% is that, not a memory loss).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import loadavg, machine, print_table, write_json  # noqa: E402
from memagent.agent import read_document  # noqa: E402
from memagent.config import AgentConfig, preset  # noqa: E402
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams  # noqa: E402
from memagent.heads import split_heads  # noqa: E402
from memagent.prompts import NO_MEMORY  # noqa: E402
from memagent.retention import item_outcomes, memory_steps, plot_timeline, ruler_evidence  # noqa: E402
from memagent.verify import string_match_all  # noqa: E402

NEEDLE = re.compile(r"special magic numbers? for ([\w-]+) is: (\d+)")
SAMPLES = Path(__file__).resolve().parents[1] / "memagent" / "data" / "samples" / "squad_dev.json"


def squad_essay() -> str:
    """The packaged SQuAD sample's paragraphs as one haystack text."""
    data = json.loads(SAMPLES.read_text())
    return " ".join(p["context"] for art in data["data"] for p in art["paragraphs"])


def documents(tokenizer: Any, length: int, n: int) -> list[dict]:
    from memagent.data.ruler import RulerGenerator

    gen = RulerGenerator(tokenizer, essay=squad_essay())
    return [gen.sample("niah_multivalue", length, i) for i in range(n)]


class ScriptedWriter(Engine):
    """A memory writer that copies needles, never reasons: ``keep_all`` or ``newest`` (module doc)."""

    def __init__(self, tokenizer: Any, mode: str):
        self.name, self.context_window, self.tokenizer, self.stats = f"scripted-{mode}", 1 << 20, tokenizer, EngineStats()
        self.mode = mode

    def _cut(self, text: str, max_tokens: int) -> tuple[str, int, str]:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return text, len(ids), "stop"
        return self.tokenizer.decode(ids[:max_tokens]), max_tokens, "length"

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams) -> Completion:
        content = messages[-1]["content"]
        memory = content.split("<memory>\n", 1)[1].rsplit("\n</memory>", 1)[0]
        if "<section>" not in content:  # the final answer
            values = re.findall(r"\b\d{7}\b", memory)
            return Completion(text=f"The answer is {', '.join(values) or 'unknown'}.", prompt_tokens=0,
                              completion_tokens=1, finish_reason="stop")
        section = content.split("<section>\n", 1)[1].rsplit("\n</section>", 1)[0]
        new = [f"{k}: {v}" for k, v in NEEDLE.findall(section)]
        head = re.search(r"New text of head (\d+):$", content)
        if head:
            count = len(re.findall(r"^## Memory head \d+ of \d+ ", memory, re.M))
            old = split_heads(memory, count)[0][int(head.group(1)) - 1]
        else:
            old = memory
        kept = [] if self.mode == "newest" or old == NO_MEMORY else [ln for ln in old.split("\n") if ln.strip()]
        text = "\n".join(kept + new) or "nothing relevant yet"
        text, n, finish = self._cut(text, params.max_tokens)
        return Completion(text=text, prompt_tokens=0, completion_tokens=n, finish_reason=finish)


async def read_all(engine: Engine, docs: list[dict], config: AgentConfig) -> list[dict]:
    """Every document read concurrently; per document its outcomes, score, decoded tokens and wall."""

    async def one(doc: dict) -> dict:
        t0 = time.perf_counter()
        r = await read_document(engine, doc["question"], doc["context"], config)
        wall = time.perf_counter() - t0
        steps = memory_steps(r.steps)
        outcomes = item_outcomes(ruler_evidence(doc), steps)
        decoded = [s.completion_tokens for s in r.steps if s.kind == "memory"]
        return {"id": doc["id"], "trace": steps, "n_read": sum(o.read_at is not None for o in outcomes),
                "captured": sum(o.captured for o in outcomes), "retained": sum(o.retained for o in outcomes),
                "score": string_match_all(r.prediction, doc["answers"]), "steps": len(decoded),
                "decoded_per_step": statistics.mean(decoded), "wall_s": wall, "prediction": r.prediction}

    return list(await asyncio.gather(*(one(d) for d in docs)))


def cell(rows: list[dict], wall: float) -> dict:
    """One (writer, length, K) figure: rates over every needle read (capture: captured / read; retention:
    retained / captured; end to end: retained / read), means over documents; the first document's trace."""
    read, cap, ret = (sum(r[k] for r in rows) for k in ("n_read", "captured", "retained"))
    trace = rows[0]["trace"]
    rows = [{k: v for k, v in r.items() if k != "trace"} for r in rows]
    return {"n_docs": len(rows), "needles_read": read, "capture": cap / read, "retention": ret / cap if cap else None,
            "end_to_end": ret / read, "first_trace": trace,
            "accuracy": statistics.mean(r["score"] for r in rows),
            "decoded_per_step": statistics.mean(r["decoded_per_step"] for r in rows),
            "steps_per_doc": statistics.mean(r["steps"] for r in rows),
            "wall_s_per_doc": wall / len(rows), "docs": rows}


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_writer(name: str, engine_for: Any, docs_by_len: dict[int, list[dict]], heads: list[int], base: AgentConfig,
               out: dict, path: str) -> None:
    """Every (length, K) cell of one writer; the JSON rewritten after each, a timeline of each cell's first document."""
    for length, docs in docs_by_len.items():
        for k in heads:
            t0 = time.perf_counter()
            rows = asyncio.run(read_all(engine_for(), docs, base.with_overrides(memory_heads=k)))
            c = cell(rows, time.perf_counter() - t0) | {"loadavg": loadavg(), "peak_rss_mib": peak_rss_mib()}
            out["results"].append({"writer": name, "length": length, "heads": k, **c})
            png = Path(path).with_name(f"{Path(path).stem}_{name}_{length // 1024}k_K{k}.png")
            plot_timeline(ruler_evidence(docs[0]), c["first_trace"], png,
                          title=f"{name}, {length // 1024}K tokens, K={k}: {docs[0]['id']}")
            print(f"{name} {length} K={k}: capture {c['capture']:.3f} retention {c['retention'] or 0:.3f} "
                  f"end-to-end {c['end_to_end']:.3f} "
                  f"accuracy {c['accuracy']:.3f} decoded/step {c['decoded_per_step']:.1f} "
                  f"wall/doc {c['wall_s_per_doc']:.1f}s", flush=True)
            write_json(path, out)  # as it goes: a kill keeps what is done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768])
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--heads", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--model-lengths", type=int, nargs="*", default=[16384])
    p.add_argument("--model-n", type=int, default=4)
    p.add_argument("--model-batch", type=int, default=16, help="the engine's max_batch_size for the model's reads")
    p.add_argument("--writers", nargs="+", default=["keep_all", "newest", "smollm2"],
                   choices=["keep_all", "newest", "smollm2"])
    a = p.parse_args()

    import torch
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.models import resolve_model

    model_dir = resolve_model("smollm2-135m")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    base = preset("small")
    out: dict[str, Any] = {"task": "niah_multivalue", "config": base.model_dump(mode="json", exclude={"prompts"}),
                           "heads": a.heads, "results": [], "machine": machine()}
    t0 = time.perf_counter()
    scripted = [w for w in a.writers if w != "smollm2"]
    docs = {n: documents(tok, n, a.n) for n in a.lengths} if scripted else {}
    out["generate_s"] = round(time.perf_counter() - t0, 1)
    for mode in scripted:
        run_writer(mode, lambda mode=mode: ScriptedWriter(tok, mode), docs, a.heads, base, out, a.out)
    if "smollm2" in a.writers and a.model_lengths:
        engine = TransformersEngine.from_config(EngineConfig(model=str(model_dir), max_batch_size=a.model_batch), name="smollm2-135m")
        out["torch_threads"] = torch.get_num_threads()
        model_docs = {n: (docs[n] if n in docs else documents(tok, n, a.model_n))[: a.model_n] for n in a.model_lengths}
        run_writer("smollm2", lambda: engine, model_docs, a.heads, base, out, a.out)
    write_json(a.out, out)
    print_table(["writer", "length", "K", "n", "capture", "retention", "end-to-end", "accuracy", "decoded/step",
                 "wall/doc s"],
                [[r["writer"], r["length"], r["heads"], r["n_docs"], r["capture"], r["retention"], r["end_to_end"],
                  r["accuracy"],
                  r["decoded_per_step"], r["wall_s_per_doc"]] for r in out["results"]])


if __name__ == "__main__":
    main()
