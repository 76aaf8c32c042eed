"""Prompt-lookup acceptance of the packaged model, measured by replaying drafts against greedy replies.

    python -m benchmarks.acceptance --out benchmarks/results/speculation_provisional.json
        [--niah-tokens 6000] [--qa-docs 60] [--preset small]

Reads a needle-in-a-haystack document and a multi-document QA row with the memory agent on the
hf engine (packaged SmolLM2-135M, greedy, batch 1) and keeps every conversation's prompt and
reply token ids. Then, per reply, replays prompt-lookup speculation decode step by decode step:
draft up to k tokens by matching the last n tokens (n from ``prompt_lookup_max`` down to
``prompt_lookup_min``, first occurrence, as transformers' prompt lookup does) in the prompt and
the reply so far; the step accepts the draft's longest prefix that agrees with the greedy reply
and adds the model's own next token. Greedy verification accepts exactly that prefix, so the
replay gives the (drafted, accepted) tokens of each decode step a speculating engine would see,
without a speculating engine (up to near-ties of the top two logits in a k+1-token forward).

The JSON's ``per_decode_step`` ([drafted, accepted, count] rows) is what the latency-model
engine draws from (``benchmarks.latency_engine.load_acceptance``); ``conversations`` holds the
per-conversation totals. k, n-gram min and max default to ``EngineConfig``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import loadavg, machine, write_json  # noqa: E402


def lookup_draft(ids: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to ``k`` tokens following the first earlier occurrence of the longest matching suffix n-gram."""
    for n in range(min(n_max, len(ids) - 1), n_min - 1, -1):
        suffix = ids[-n:]
        for i in range(len(ids) - n):  # the suffix itself (at len - n) is not a match
            if ids[i:i + n] == suffix:
                return ids[i + n:i + n + k]
    return []


def replay(prompt: list[int], reply: list[int], k: int, n_min: int, n_max: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per decode step of ``reply`` under greedy prompt-lookup speculation.

    The first token comes from the prefill (no draft, not a step here); each later step drafts
    (never past the reply's end), accepts the agreeing prefix and emits one token of its own.
    """
    steps, pos = [], 1
    while pos < len(reply):
        draft = lookup_draft(prompt + reply[:pos], k, n_min, n_max)[:len(reply) - pos - 1]
        accepted = 0
        while accepted < len(draft) and draft[accepted] == reply[pos + accepted]:
            accepted += 1
        steps.append((len(draft), accepted))
        pos += accepted + 1
    return steps


async def read_rows(rows: list[dict], agent, threads: int) -> list[dict]:
    from memagent.agent import read_document
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    import torch

    torch.set_num_threads(threads)  # batch 1 on a shared machine: one thread, no spinning over the others
    engine = TransformersEngine.from_config(EngineConfig(dtype="fp32", max_batch_size=1))
    out = []
    try:
        for row in rows:
            t0 = time.perf_counter()
            result = await read_document(engine, row["question"], row["context"], agent, keep_completions=True)
            print(f"{row['id']}: {len(result.steps)} conversations, {sum(s.completion_tokens for s in result.steps)} "
                  f"tokens out, in {time.perf_counter() - t0:.1f} s", flush=True)
            out += [{"row": row["id"], "kind": s.kind, "prompt": c.prompt_token_ids, "reply": c.token_ids}
                    for s, c in zip(result.steps, result.completions or [])]
    finally:
        await engine.close()
    return out


def main() -> None:
    from memagent.config import AgentConfig
    from memagent.data.demo import niah_row, qa_row
    from memagent.engines import EngineConfig

    defaults = EngineConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--niah-tokens", type=int, default=6000)
    parser.add_argument("--qa-docs", type=int, default=60, help="documents in the multi-document QA row")
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--k", type=int, default=defaults.speculative_tokens)
    parser.add_argument("--n-min", type=int, default=defaults.prompt_lookup_min)
    parser.add_argument("--n-max", type=int, default=defaults.prompt_lookup_max)
    args = parser.parse_args()

    agent = AgentConfig(preset=args.preset)
    rows = [niah_row(0, args.niah_tokens, 0.6, args.seed), qa_row(0, args.qa_docs, args.seed)]
    load0, t0 = loadavg(), time.perf_counter()
    convs = asyncio.run(read_rows(rows, agent, args.threads))
    read_s = time.perf_counter() - t0
    hist: Counter[tuple[int, int]] = Counter()
    records = []
    for c in convs:
        steps = replay(c["prompt"], c["reply"], args.k, args.n_min, args.n_max)
        hist.update(steps)
        records.append({"row": c["row"], "kind": c["kind"], "prompt_tokens": len(c["prompt"]),
                        "completion_tokens": len(c["reply"]), "draft_tokens": sum(d for d, _ in steps),
                        "accepted_tokens": sum(a for _, a in steps), "decode_steps": len(steps) + 1})
    drafted = sum(d * n for (d, _), n in hist.items())
    accepted = sum(a * n for (_, a), n in hist.items())
    n_steps = sum(hist.values())
    tokens = sum(r["completion_tokens"] for r in records)
    data = {
        "benchmark": "speculation_acceptance", "model": "smollm2-135m", "how": "greedy replies replayed "
        "under prompt lookup (first occurrence of the longest n-gram), see benchmarks/acceptance.py",
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "accepted_per_step": round(accepted / n_steps, 4) if n_steps else None,
        "drafted_per_step": round(drafted / n_steps, 4) if n_steps else None,
        "steps_without_draft": round(hist_share(hist, lambda d, a: d == 0), 4),
        "tokens_per_decode_step": round(tokens / sum(r["decode_steps"] for r in records), 4),
        "settings": {"k": args.k, "prompt_lookup_min": args.n_min, "prompt_lookup_max": args.n_max,
                     "agent": agent.model_dump(mode="json", exclude={"prompts"}), "niah_tokens": args.niah_tokens,
                     "qa_docs": args.qa_docs, "seed": args.seed, "torch_threads": args.threads},
        "per_decode_step": [[d, a, n] for (d, a), n in sorted(hist.items())],
        "conversations": records, "read_s": round(read_s, 1), "loadavg_start": load0, "loadavg_end": loadavg(),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), "machine": machine(),
    }
    write_json(args.out, data)
    print({k: v for k, v in data.items() if k not in ("per_decode_step", "conversations", "machine", "settings")})


def hist_share(hist: Counter, pred) -> float:
    total = sum(hist.values())
    return sum(n for (d, a), n in hist.items() if pred(d, a)) / total if total else 0.0


if __name__ == "__main__":
    main()
