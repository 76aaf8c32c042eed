"""How long does one long prompt stall the server's event loop while it is tokenised? (issue 53, item 6)

    python -m benchmarks.serve_prompt_stall --tokens 127000 --out benchmarks/results/serve_prompt_stall.json

A heartbeat coroutine wakes every millisecond on the server's event loop (as every stream's next
chunk would); the stall is the longest gap between two of its wake-ups while one request's prompt
of ``--tokens`` tokens is prepared. ``before``: the path before issue 53 (6): the prompt counted in
a worker thread, then encoded again by the hf engine's ``chat`` on the event loop. ``after``:
``EngineModel.encode``: encoded once, in a worker thread, the ids handed to ``Engine.chat_ids``.
Only tokenisation is measured (no decode: the tokenizer is SmolLM2's, the model is not loaded
into the path). Keys per path: ``stall_ms`` (median over ``--repeats``, and each run's),
``wall_s`` (median seconds to have the ids), ``encodes`` (times the prompt is tokenised).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from benchmarks.common import build_tiny_llama, loadavg, machine, print_table, write_json

WORDS = "the memory agent reads a long document chunk by chunk and keeps what matters ".split()


async def _stall(work: Any) -> tuple[float, float]:
    """(longest heartbeat gap in ms, seconds) while ``work()`` (a coroutine) runs on this loop."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def heartbeat() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0.01)
    t0 = time.perf_counter()
    await work()
    wall = time.perf_counter() - t0
    done.set()
    await beat
    return 1000 * max(gaps), wall


def _prompt(tokenizer: Any, tokens: int) -> list[dict[str, str]]:
    text = " ".join(WORDS[i % len(WORDS)] for i in range(tokens))
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    return [{"role": "user", "content": tokenizer.decode(ids)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=127_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/serve_prompt_stall.json")
    args = parser.parse_args()

    import tempfile

    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.serve.chat import EngineModel

    tiny = build_tiny_llama(tempfile.mkdtemp(prefix="stall-") + "/tiny")
    engine = TransformersEngine.from_config(EngineConfig(model=str(tiny), context_window=args.tokens + 1024))
    model = EngineModel(engine, 4096)
    messages = _prompt(engine.tokenizer, args.tokens)

    async def before() -> None:  # issue 53's path: counted in a thread, then encoded by chat on the loop
        await asyncio.to_thread(engine.count_chat_tokens, messages)
        engine.encode_chat(messages)

    async def after() -> None:  # encoded once, in a thread; chat_ids takes the ids
        await model.encode(messages)

    results: dict[str, Any] = {}
    for name, work, encodes in (("before", before, 2), ("after", after, 1)):
        runs = [asyncio.run(_stall(work)) for _ in range(args.repeats)]
        results[name] = {"stall_ms": statistics.median(r[0] for r in runs), "stall_ms_runs": [r[0] for r in runs],
                         "wall_s": statistics.median(r[1] for r in runs), "encodes": encodes}
    prompt_tokens = engine.count_chat_tokens(messages)
    write_json(args.out, {"prompt_tokens": prompt_tokens, "repeats": args.repeats, "paths": results,
                          "machine": machine(), "loadavg": loadavg()})
    print(f"prompt of {prompt_tokens} tokens, median of {args.repeats} runs")
    print_table(["path", "loop stall ms", "seconds to ids", "encodes"],
                [[k, round(v["stall_ms"], 1), round(v["wall_s"], 3), v["encodes"]] for k, v in results.items()])


if __name__ == "__main__":
    main()
