"""OpenAI Batch API runs against ``memagent batch``: the API's cost per document, and what a kill at 50% redoes.

    python -m benchmarks.openai_batch --docs 4 --chats 8 --doc-tokens 1200

1. ``api_vs_batch``: the same long documents (memagent lines, greedy) answered by the runner behind
   ``/v1/batches`` (:meth:`pipelines.openai_batch_api.BatchService.run`: parse, each line through serve's
   handler in one process, output files) and by ``run_batch_qa`` on the same rows as Parquet (``memagent
   batch``, Ray actors); then the mixed batch (documents and short chats). HTTP upload and polling are not in
   the figure (a few ms each).
2. ``kill_at_50``: ``memagent run-batch`` on the mixed batch, SIGKILLed with its process group once half the
   lines are answered, then rerun: the lines answered before the kill must not be answered again (the
   documents being read at the kill are read again from their start: batch lines keep no checkpoints).

Writes benchmarks/results/openai_batch.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_model, loadavg, machine, print_table, write_json

AGENT = dict(chunk_tokens=128, memory_tokens=16, answer_tokens=8, query_tokens=64)


def request_lines(model_dir: str, docs: int, chats: int, tokens: int) -> list[dict]:
    from transformers import AutoTokenizer

    from benchmarks.common import niah_docs

    tok = AutoTokenizer.from_pretrained(model_dir)
    lines = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "memagent", "temperature": 0,  # greedy, as the batch job's default agent reads
                       "messages": [{"role": "user", "content": r["context"]},
                                    {"role": "user", "content": r["question"]}]}}
             for i, r in enumerate(niah_docs(tok, docs, tokens))]
    lines += [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "tiny-llama", "max_tokens": 16, "messages": [{"role": "user", "content": f"Hi {i}"}]}}
              for i in range(chats)]
    return lines


def api_vs_batch(model_dir: str, lines: list[dict], work: Path, repeats: int) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from memagent.config import AgentConfig
    from memagent.engines import EngineConfig
    from memagent.serve.memagent_model import split_conversation
    from memagent.serve.protocol import ChatRequest
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig
    from pipelines.openai_batch import BatchRunConfig, jsonl
    from pipelines.openai_batch_api import BatchService

    engine, agent, job = EngineConfig(model=model_dir), AgentConfig(**AGENT), JobConfig(progress=False)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    docs = [x for x in lines if x["body"]["model"] == "memagent"]
    rows = []
    for x in docs:
        document, question = split_conversation(ChatRequest.model_validate(x["body"]))
        rows.append({"id": x["custom_id"], "question": question, "context": document})
    (work / "in").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), work / "in" / "part-0.parquet")
    service = BatchService(str(work / "root"), BatchRunConfig(engine=engine, agent=agent, engine_model="tiny-llama"))

    def via_api(subset: list[dict]) -> float:
        f = service.add_file(jsonl(subset), "r.jsonl", "batch")
        batch = service.create({"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                "completion_window": "24h"})
        t = time.perf_counter()
        service.run(batch["id"])
        assert service.batch(batch["id"])["status"] == "completed"
        return time.perf_counter() - t

    def via_batch(k: int) -> float:
        t = time.perf_counter()
        run_batch_qa(BatchQAConfig(input=str(work / "in"), output=str(work / f"out{k}"), engine=engine, agent=agent,
                                   job=job))
        return time.perf_counter() - t

    # Interleaved, best of `repeats`: the first run of either pays Ray's and the model's warm-up.
    raw: dict[str, list[float]] = {"memagent_batch_docs_s": [], "api_docs_s": []}
    for k in range(repeats):
        raw["memagent_batch_docs_s"].append(via_batch(k))
        raw["api_docs_s"].append(via_api(docs))
    times = {name: min(v) for name, v in raw.items()}
    times["api_mixed_s"] = via_api(lines)
    times["raw"] = raw
    ray.shutdown()
    times["api_overhead_pct"] = 100 * (times["api_docs_s"] / times["memagent_batch_docs_s"] - 1)
    return times


def kill_at_50(model_dir: str, lines: list[dict], work: Path) -> dict:
    """``memagent run-batch`` SIGKILLed once half the lines are answered, then rerun on the same state."""
    requests, out = work / "requests.jsonl", work / "results.jsonl"
    work.mkdir(parents=True, exist_ok=True)
    requests.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cmd = [sys.executable, "-m", "memagent_cli", "run-batch", "-i", str(requests), "-o", str(out), "-q",
           "--model", model_dir, "--served-model", "tiny-llama",
           *[a for k, v in AGENT.items() for a in (f"--{k.replace('_', '-')}", str(v))]]
    proc = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.DEVNULL)
    answered = work / "results.jsonl.work" / "run" / "lines"
    while proc.poll() is None and len(list(answered.glob("*.json"))) < len(lines) / 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the machine dies: the process and everything under it
    proc.wait()
    at_kill = {p: p.stat().st_mtime_ns for p in answered.glob("*.json")}
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    rerun_s = time.perf_counter() - t
    results = [json.loads(x) for x in out.read_text().splitlines()]
    return {"lines_answered_at_kill": len(at_kill),
            "lines_answered_again": sum(p.stat().st_mtime_ns != m for p, m in at_kill.items()),
            "lines_answered_by_rerun": len(list(answered.glob("*.json"))) - len(at_kill), "rerun_s": rerun_s,
            "custom_ids_once": len({r["custom_id"] for r in results}) == len(results) == len(lines)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=4)
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--doc-tokens", type=int, default=1200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/openai_batch.json")
    args = parser.parse_args()
    model_dir = bench_model("tiny")
    lines = request_lines(model_dir, args.docs, args.chats, args.doc_tokens)
    work = Path(tempfile.mkdtemp(prefix="bench-openai-batch-"))
    load = loadavg()
    timings = api_vs_batch(model_dir, lines, work / "a", args.repeats)
    kill = kill_at_50(model_dir, lines, work / "k")
    data = {"settings": {**vars(args), "agent": AGENT, "model": "tiny-llama (random, 2 layers)"},
            "api_vs_batch": timings, "kill_at_50": kill, "load_before": load, "load_after": loadavg(),
            "machine": machine()}
    write_json(args.out, data)
    print_table(["measure", "value"], [*((k, v) for k, v in timings.items() if k != "raw"), *kill.items()])


if __name__ == "__main__":
    main()
