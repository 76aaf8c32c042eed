"""Event-loop CPU per streamed token of ``memagent serve``'s engine model, against the reply's length.

    nice python -m benchmarks.serve_stream_cpu --out benchmarks/results/serve_stream_cpu.json

:meth:`memagent.serve.chat.EngineModel.events` (the one path every streamed chat, Responses and Messages
reply takes) consumes a reply of 1K, 4K and 16K tokens handed over one token at a time, as the hf engine's
decode thread hands them (``on_tokens``). The engine is a double that replays fixed token ids (prose with
accents and CJK, the packaged SmolLM2 tokenizer), so the figure is the server's own work per token: turning
ids into text, holding back a stop string's possible start, yielding the piece. Measured as the event-loop
thread's CPU time (``time.thread_time``) over the whole stream, per token; with no stop string and with
``stop=["Observation:"]`` (a ReAct agent's). ``before``: the same path with the replaced code (the whole reply
decoded at every step) put back, for the lengths it finishes in reasonable time.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from benchmarks.common import machine, print_table, write_json
from memagent.engines.base import Completion, SamplingParams
from memagent.serve import chat
from memagent.serve.events import ContentDelta
from memagent.serve.protocol import ChatRequest

PROSE = "The memory holds every value the document states, ünïcödé and 漢字 included; the answer reads it. "


class ReplayEngine:
    """An engine double that streams fixed token ids, one a step, through ``on_tokens``."""

    takes_prompt_ids = False
    streams_tokens = True
    context_window = 10**6

    def __init__(self, tokenizer, ids: list[int]):
        self.tokenizer, self.ids = tokenizer, ids

    async def chat(self, messages, params: SamplingParams, on_tokens=None) -> Completion:
        for i in self.ids:
            on_tokens([i])
            await asyncio.sleep(0)
        return Completion(text=self.tokenizer.decode(self.ids, skip_special_tokens=True), prompt_tokens=1,
                          completion_tokens=len(self.ids), finish_reason="length")


class WholeText:
    """The replaced code: the whole reply decoded at every step."""

    def __init__(self, decode):
        self.decode, self.ids, self.text = decode, [], ""

    def add(self, new):
        self.ids += new
        text = self.decode(self.ids)
        if text.endswith("\ufffd") or len(text) <= len(self.text):
            return ""
        delta, self.text = text[len(self.text):], text
        return delta


def stream_cpu(tokenizer, n: int, stop: tuple[str, ...]) -> dict:
    ids = tokenizer(PROSE * (n // 20 + 1), add_special_tokens=False)["input_ids"][:n]
    model = chat.EngineModel(ReplayEngine(tokenizer, ids), max_tokens=n)
    req = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True})
    prepared = chat.Prepared([{"role": "user", "content": "go"}], SamplingParams(max_tokens=n, stop=stop), None)

    async def consume() -> tuple[float, int]:
        t0, pieces = time.thread_time(), 0
        async for event in model.events(req, prepared):
            pieces += isinstance(event, ContentDelta)
        return time.thread_time() - t0, pieces

    cpu, pieces = asyncio.run(consume())
    return {"tokens": n, "stop": list(stop), "pieces": pieces, "loop_cpu_s": round(cpu, 4),
            "us_per_token": round(1e6 * cpu / n, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--before-max", type=int, default=16384, help="longest reply the replaced code runs")
    parser.add_argument("--out", default="benchmarks/results/serve_stream_cpu.json")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from memagent.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for stop in ((), ("Observation:",)):
        for n in lengths:
            rows.append({"code": "incremental", **stream_cpu(tokenizer, n, stop)})
    new = chat.IncrementalText
    chat.IncrementalText = WholeText
    try:
        for n in (x for x in lengths if x <= args.before_max):
            rows.append({"code": "before (whole decode per step)", **stream_cpu(tokenizer, n, ())})
    finally:
        chat.IncrementalText = new
    write_json(args.out, {"rows": rows, "machine": machine()})
    table = [(r["code"], r["tokens"], ",".join(r["stop"]) or "-", r["loop_cpu_s"], r["us_per_token"]) for r in rows]
    print_table(["code", "reply tokens", "stop", "loop CPU s", "µs / token"], table)
    Path(args.out).with_suffix(".md").write_text(
        "# Event-loop CPU per streamed token (benchmarks/serve_stream_cpu.py)\n\n"
        f"`python -m benchmarks.serve_stream_cpu`; machine: {machine()}\n\n"
        "| code | reply tokens | stop | loop CPU s | µs / token |\n|---|---|---|---|---|\n"
        + "".join(f"| {a} | {b:,} | {c} | {d} | {e} |\n" for a, b, c, d, e in table))


if __name__ == "__main__":
    main()
