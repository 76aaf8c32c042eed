"""The scale benchmark's chain isolation (``python -m benchmarks.scale --chain-others 0,3,15``): the lake's longest
document on one simulated engine, alone and with other documents reading beside it, no Ray.
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.latency_engine import LatencyModel


def run_chain(lake_dir: Path, args, model: LatencyModel, agent) -> list[dict]:
    """The lake's longest document on one simulated engine, alone and with k other documents kept reading.

    No Ray, no job: ``read_document`` on one :class:`LatencyEngine`; each of ``k`` workers reads
    the lake's documents under 40K tokens one after another until the long one is done. Times are
    modelled seconds (wall / ``time_scale``).
    """
    import asyncio

    import pyarrow.dataset as pads

    from benchmarks.latency_engine import LatencyEngine
    from memagent.agent import read_document

    rows = pads.dataset(sorted(lake_dir.glob("*.parquet")), format="parquet").to_table(
        columns=["id", "question", "context", "target_tokens"]).to_pylist()
    long = max(rows, key=lambda r: r["target_tokens"])
    others = [r for r in rows if r["target_tokens"] < 40_000]
    out = []
    for k in (int(x) for x in args.chain_others.split(",")):
        engine = LatencyEngine(model)

        async def main() -> dict:
            done, finished = asyncio.Event(), [0]

            async def other(i: int) -> None:
                while not done.is_set():
                    r = others[i % len(others)]
                    await read_document(engine, r["question"], r["context"], agent)
                    finished[0] += 1
                    i += k

            t0 = time.perf_counter()
            workers = [asyncio.ensure_future(other(i)) for i in range(k)]
            await read_document(engine, long["question"], long["context"], agent)
            chain_s = (time.perf_counter() - t0) / model.time_scale
            done.set()
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            return {"others_in_flight": k, "chain_s": round(chain_s, 1), "others_done": finished[0],
                    "engine_busy_s": round(engine.sim.busy_s, 1), "steps": engine.sim.steps,
                    "prefill_tokens": engine.sim.prefill_tokens, "decode_tokens": engine.sim.decode_tokens}

        out.append({"doc": f'{long["id"]} ({long["target_tokens"]:,} tokens)', **asyncio.run(main())})
        print(out[-1], flush=True)
    return out
