"""Helpers shared by the pipeline tests: input datasets and reading outputs back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from memagent.config import AgentConfig
from memagent.data.demo import niah_row
from memagent.engines import EngineConfig
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from memagent_testing.engine_faults import CrashOnce, FaultAtCall  # noqa: F401 (the tests' crash seams)

# Small enough that a random tiny model reads a document in well under a second.
FAST_AGENT = AgentConfig(chunk_tokens=64, memory_tokens=8, answer_tokens=6, query_tokens=64)


def good_rows(n: int, start: int = 0, tokens: int = 150) -> list[dict]:
    rows = [niah_row(i, tokens, depth=0.5, seed=7) for i in range(start, start + n)]
    return [{"id": f"doc-{i:03d}", "question": r["question"], "context": r["context"], "answers": r["answers"],
             "source": "generated"} for i, r in zip(range(start, start + n), rows)]


def write_rows(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def launches(out: str | Path) -> list[dict]:
    """The launch records of a training run's output directory (pipelines.train_job.LAUNCHES), in order."""
    from pipelines.train_job import LAUNCHES

    return [json.loads(x) for x in (Path(out) / LAUNCHES).read_text().splitlines()]


def read_output(path: str | Path, filesystem=None) -> list[dict]:
    ds = pads.dataset(str(path), format="parquet", filesystem=filesystem, exclude_invalid_files=False,
                      ignore_prefixes=["_", "."])
    return ds.to_table().to_pylist()


class KillInRollout:
    """Training's ``reward_fn`` seam, for fail-over tests: rank ``rank`` kills its own process
    (SIGKILL, like the OOM killer) in the first rollout after checkpoint ``after_tag`` is the
    latest in ``out_dir``, once per ``marker`` file; otherwise the default reward."""

    def __init__(self, out_dir: Path, after_tag: str, marker: Path, rank: int = 0):
        self.ckpt, self.after_tag, self.marker, self.rank = str(Path(out_dir) / "checkpoints"), after_tag, str(marker), rank

    def __call__(self, response: str, answers: Any) -> float:
        from memagent.rl.checkpoint import latest_tag
        from memagent.rl.rollout import default_reward

        rank = int(os.environ.get("RANK", 0))  # set by Ray Train in each worker
        if rank == self.rank and not os.path.exists(self.marker) and latest_tag(Path(self.ckpt)) == self.after_tag:
            Path(self.marker).write_text(f"killed rank {rank} (pid {os.getpid()}) after {self.after_tag}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return default_reward(response, answers)


class ScriptedEngine(Engine):
    """Sleeps ``sleep_s`` per conversation and replies with a fixed text; logs (time, question) per call."""

    def __init__(self, tokenizer, sleep_s: float, log: str | None):
        self.name, self.context_window, self.tokenizer, self.stats = "scripted", 4096, tokenizer, EngineStats()
        self.sleep_s, self.log = sleep_s, log

    async def chat(self, messages, params: SamplingParams) -> Completion:
        content = messages[-1]["content"]
        question = content.split("<problem>\n", 1)[1].split("\n</problem>", 1)[0]
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps({"t": time.time(), "q": question}) + "\n")
        await asyncio.sleep(self.sleep_s)
        self.stats.requests += 1
        text = "mem" if "Updated memory" in content else "So the answer is 42."
        return Completion(text=text, prompt_tokens=10, completion_tokens=3, finish_reason="stop")


def scripted_engine(config: dict, engine_config: EngineConfig | None = None) -> ScriptedEngine:
    """Bound to ``config`` with functools.partial: the job's ``build_engine`` (runs inside the Ray actor)."""
    from transformers import AutoTokenizer

    return ScriptedEngine(AutoTokenizer.from_pretrained(config["tokenizer"]), config["sleep_s"], config.get("log"))


def interruptible() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: SIGINT back to its default action.

    A suite started in the background by a non-interactive shell (``nohup``, ``cmd &`` in a
    script or a CI step) runs with SIGINT ignored, and children inherit that: Python then
    installs no KeyboardInterrupt handler and the child never sees the test's Ctrl-C.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
