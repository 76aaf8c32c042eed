"""A latency-model engine: the ``Engine`` interface with no model, for scale benchmarks only.

Never a product engine (``make_engine`` does not know it). It stands in for one GPU running one
model under a continuous-batching server (vLLM's scheduler, simplified):

- every ``chat`` call becomes a sequence: ``prompt_tokens`` to prefill, then ``completion_tokens``
  to decode, one token per step;
- one scheduler coroutine runs *steps*. A step takes every running sequence that is decoding
  (one token each) and fills the rest of the step's token budget with prefill of waiting
  sequences, first come first served (chunked prefill); at most ``max_seqs`` sequences run at
  once, at most ``max_tokens_per_step`` tokens per step;
- a step lasts ``prefill_tokens * a + decode_seqs * b + c`` seconds (a roofline: prefill is
  compute-bound, a decode step reads the weights once (c) plus each sequence's KV cache (b)),
  and the scheduler *sleeps* that long (times ``time_scale``), so eight simulated GPUs cost
  almost no CPU.

- speculative decoding (prompt lookup, vLLM's n-gram method), when ``speculative_tokens`` > 0:
  each decoding sequence drafts up to k tokens a step and the step verifies them in the same
  forward. A drafted token takes a token of the step's budget and costs ``a`` like a prefill
  token (the sequence's KV cache is still read once: ``b``); the sequence then advances by the
  drafted tokens accepted plus the model's own next one. (drafted, accepted) per decode step are
  drawn from a measured distribution (:func:`load_acceptance`) or from a fixed mean acceptance
  rate (:class:`Acceptance`), by a seeded generator per engine.

Replies are deterministic, so the agent's real loop, chunking and trace code run unchanged:
a memory update keeps every sentence of the previous memory and of the section that holds a
digit string (capped at the request's ``max_tokens``); the answer is the last digit string of the
memory ("none" when there is none). Tokens are counted with the policy tokenizer's tiktoken twin
(the same BPE as the packaged model), so prompt and reply lengths are real token counts.

Build one inside each Ray actor of a batch job from a plain dict (the job's ``build_engine``
seam): ``run_batch_qa(cfg, build_engine=engine_builder(model_dict(model)))``.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import itertools
import json
import math
import random
import re
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from memagent.engines.base import Completion, Engine, EngineStats, Messages, SamplingParams


@dataclass(frozen=True)
class LatencyModel:
    """One GPU serving one model. Defaults: an 8B dense model (Llama-3.1-8B shape) in bf16 on one H100 SXM.

    Sources (public; replace with measured numbers when a GPU check has run):
    - ``a`` (prefill, s per token) = 2 x 8.0e9 FLOP/token / (989e12 FLOP/s bf16 dense x 0.5 MFU)
      = 32 us. H100 SXM datasheet (989 TFLOPS bf16 dense, 3.35 TB/s HBM3); 50% MFU is what
      vLLM/SGLang prefill reaches on 8B models in their published benchmarks (e.g. the vLLM v0.6
      performance blog, 2024-09-05: ~20-30K prefill tokens/s for Llama-3-8B on one H100).
    - ``c`` (fixed cost of a step, s) = 16.1e9 bytes of bf16 weights / 3.35e12 B/s = 4.8 ms,
      rounded up to 6 ms for kernel launches and sampling (vLLM's published single-request
      TPOT for Llama-3-8B on H100 is 6-7 ms).
    - ``b`` (decode, s per running sequence per step) = KV bytes one sequence reads per step:
      Llama-3-8B has 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB per token;
      a memory-agent conversation holds ~6K tokens (5K chunk + memory + template) = 0.8 GB,
      / 3.35 TB/s = 0.24 ms -> 0.25 ms.
    - ``max_seqs`` = 64: what the KV cache holds at ~6K tokens per sequence (80 GB x 0.9 - 16 GB
      weights = 56 GB / 0.8 GB = 70), below vLLM's ``max_num_seqs`` default of 256.
    - ``max_tokens_per_step`` = 8192: vLLM's ``max_num_batched_tokens`` for chunked prefill.
    """

    a_prefill_s_per_token: float = 32e-6
    b_decode_s_per_seq: float = 0.25e-3
    c_step_s: float = 6e-3
    max_seqs: int = 64
    max_tokens_per_step: int = 8192
    time_scale: float = 1.0  # sleep this fraction of each modelled step (benchmarks shrink time)
    # Count long prompts (> 4000 chars) as chars / this instead of tokenising them again (the agent
    # has already tokenised the document once to chunk it); None: exact counts. Saves the CPU that
    # eight simulated GPUs on two shared cores would otherwise spend re-tokenising every prompt.
    chars_per_token: float | None = None
    # vLLM's scheduling_policy="priority" (EngineConfig.priority_scheduling): waiting sequences are
    # admitted and running ones given prefill tokens by (priority, arrival); False: first come first
    # served. Simplified: vLLM also preempts lower-priority running sequences when its KV cache is full.
    priority_scheduling: bool = False
    # Speculative decoding: most tokens drafted per sequence and step (0: off; vLLM's
    # num_speculative_tokens, EngineConfig.speculative_tokens). What the drafts achieve: either a
    # fixed mean acceptance rate (accepted / drafted tokens) or measured steps, [drafted, accepted,
    # count] per decode step (load_acceptance); exactly one of the two when speculating.
    speculative_tokens: int = 0
    speculation_acceptance: float | None = None
    speculation_steps: tuple[tuple[int, int, int], ...] = ()
    speculation_seed: int = 0

    def __post_init__(self) -> None:
        # Plain data crosses into Ray actors as lists; keep the model hashable and comparable.
        object.__setattr__(self, "speculation_steps", tuple(tuple(int(x) for x in r) for r in self.speculation_steps))
        if self.speculative_tokens < 0:
            raise ValueError(f"speculative_tokens must be >= 0, got {self.speculative_tokens}")
        if self.speculative_tokens == 0:
            return
        if (self.speculation_acceptance is None) == (not self.speculation_steps):
            raise ValueError("speculating: give exactly one of speculation_acceptance (a fixed rate) and "
                             "speculation_steps (measured [drafted, accepted, count] per decode step)")
        if self.speculation_acceptance is not None and not 0.0 <= self.speculation_acceptance <= 1.0:
            raise ValueError(f"speculation_acceptance is a rate in [0, 1], got {self.speculation_acceptance}")
        for row in self.speculation_steps:
            if len(row) != 3 or not 0 <= row[1] <= row[0] or row[2] < 0:
                raise ValueError(f"speculation_steps rows are [drafted, accepted <= drafted, count >= 0], got {row}")
        if not sum(r[2] for r in self.speculation_steps) and self.speculation_acceptance is None:
            raise ValueError("speculation_steps counts sum to 0")

    @property
    def speculating(self) -> bool:
        return self.speculative_tokens > 0

    def step_seconds(self, prefill_tokens: int, decode_seqs: int) -> float:
        """Modelled duration of one step (unscaled)."""
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return prefill_tokens * self.a_prefill_s_per_token + decode_seqs * self.b_decode_s_per_seq + self.c_step_s

    def ideal_seconds(self, prefill_tokens: int, decode_tokens: int) -> float:
        """Modelled time of an always-full engine for this work: every step packed to its caps.

        ``a * P`` and ``b * D`` are paid whatever the packing; ``c`` once per step, and the fewest
        steps that can carry the work are ``max(D / max_seqs, (P + D) / max_tokens_per_step)``.
        """
        steps = max(decode_tokens / self.max_seqs, (prefill_tokens + decode_tokens) / self.max_tokens_per_step)
        return prefill_tokens * self.a_prefill_s_per_token + decode_tokens * self.b_decode_s_per_seq \
            + steps * self.c_step_s

    def chain_seconds(self, prompt_tokens: int, completion_tokens: int) -> float:
        """Modelled time of one conversation alone on an idle engine (unscaled).

        Prefill in steps of at most ``max_tokens_per_step`` (the last one samples the first token),
        then one decode step per token; speculating, the expected number of decode steps
        (``completion_tokens - 1`` over the mean tokens a step yields), each verifying the mean draft.
        """
        cap = self.max_tokens_per_step
        prefill = self.step_seconds(min(prompt_tokens, cap), 1) + (math.ceil(prompt_tokens / cap) - 1) * self.c_step_s
        rest = max(0, completion_tokens - 1)
        if not self.speculating:
            return prefill + rest * self.step_seconds(0, 1)
        drafted, accepted = Acceptance(self).means()
        return prefill + rest / (1.0 + accepted) * self.step_seconds(drafted, 1)  # type: ignore[arg-type]


class Acceptance:
    """(drafted, accepted) tokens of one decode step of one sequence, drawn from the model's setting.

    A fixed rate r: k tokens drafted every step, each accepted with probability p until the first
    rejection (the i.i.d. model of Leviathan et al., 2023), p chosen so that the mean accepted /
    drafted is r. Measured steps: drawn with their counts as weights, drafts cut to k.
    """

    def __init__(self, model: LatencyModel, seed: int | None = None):
        k = model.speculative_tokens
        if model.speculation_acceptance is not None:
            p = per_token_acceptance(model.speculation_acceptance, k)
            rows = [(k, a, (p ** a) * (1 - p) if a < k else p ** k) for a in range(k + 1)]
        else:
            rows = [(min(d, k), min(a, k), float(c)) for d, a, c in model.speculation_steps]
        rows = [r for r in rows if r[2] > 0]
        self.pairs = [(d, a) for d, a, _ in rows]
        self._cum = list(itertools.accumulate(w for _, _, w in rows))
        self._rng = random.Random(model.speculation_seed if seed is None else seed)

    def draw(self) -> tuple[int, int]:
        i = bisect.bisect_right(self._cum, self._rng.random() * self._cum[-1])
        return self.pairs[min(i, len(self.pairs) - 1)]

    def means(self) -> tuple[float, float]:
        """Mean drafted and mean accepted tokens per decode step."""
        weights = [b - a for a, b in zip([0.0, *self._cum], self._cum)]
        total = self._cum[-1]
        return (sum(w * d for w, (d, _) in zip(weights, self.pairs)) / total,
                sum(w * a for w, (_, a) in zip(weights, self.pairs)) / total)


def per_token_acceptance(rate: float, k: int) -> float:
    """p such that k drafts, each accepted with probability p until the first rejection, average ``rate`` accepted."""
    target, lo, hi = rate * k, 0.0, 1.0
    if rate <= 0.0 or rate >= 1.0:
        return min(max(rate, 0.0), 1.0)
    for _ in range(60):  # E[accepted] = p + p^2 + ... + p^k, increasing in p
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** i for i in range(1, k + 1)) < target else (lo, mid)
    return (lo + hi) / 2


def load_acceptance(path: str | Path) -> dict[str, Any]:
    """Measured speculation of a results file: ``steps`` as [drafted, accepted, count] per decode step.

    Reads ``per_decode_step`` ([drafted, accepted, count] rows: benchmarks/acceptance.py) when the
    file has it, otherwise the per-conversation records it holds (benchmarks/speculation.py's
    ``per_step``: ``drafted``, ``accepted``, ``completion_tokens``; or a trace's ``draft_tokens``,
    ``accepted_tokens``, ``decode_steps``), each spread evenly over its decode steps after the
    first token (the mean per step kept; the spread within a conversation is not in such a file).
    A step yields its accepted tokens plus one, so those steps are ``completion_tokens -
    accepted - 1`` where the record has ``completion_tokens``, else ``decode_steps - 1``.
    """
    data = json.loads(Path(path).read_text())
    steps = data.get("per_decode_step") if isinstance(data, dict) else None
    if steps is None:
        counts: dict[tuple[int, int], int] = {}
        for drafted, accepted, n in _conversation_records(data):
            for i in range(n):  # step i gets its share of the totals, rounded so they add up
                d = (drafted * (i + 1)) // n - (drafted * i) // n
                a = (accepted * (i + 1)) // n - (accepted * i) // n
                counts[(d, min(a, d))] = counts.get((d, min(a, d)), 0) + 1
        steps = [[d, a, c] for (d, a), c in sorted(counts.items())]
    if not steps:
        raise ValueError(f"{path}: no speculation measurements (per_decode_step rows or records with "
                         "draft_tokens, accepted_tokens, decode_steps)")
    total = sum(c for _, _, c in steps)
    drafted, accepted = sum(d * c for d, _, c in steps), sum(a * c for _, a, c in steps)
    return {"source": str(path), "steps": [list(map(int, r)) for r in steps], "decode_steps": total,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "accepted_per_step": round(accepted / total, 4), "drafted_per_step": round(drafted / total, 4)}


def _conversation_records(data: Any) -> list[tuple[int, int, int]]:
    """(drafted, accepted, decode steps after the first token) of every conversation record under ``data``."""
    if isinstance(data, dict) and isinstance(data.get("per_step"), list):
        data = data["per_step"]  # benchmarks/speculation.py: its totals beside per_step are not records
    out: list[tuple[int, int, int]] = []
    if isinstance(data, list):
        for v in data:
            out += _conversation_records(v)
        return out
    if not isinstance(data, dict):
        return out
    drafted, accepted = data.get("drafted", data.get("draft_tokens")), data.get("accepted", data.get("accepted_tokens"))
    if drafted is None or accepted is None:
        for v in data.values():
            out += _conversation_records(v)
        return out
    if "completion_tokens" in data:
        steps = data["completion_tokens"] - accepted - 1
    else:
        steps = (data.get("decode_steps") or 0) - 1
    return [(int(drafted), int(accepted), int(steps))] if steps > 0 else []


@dataclass
class _Seq:
    prefill_left: int
    decode_left: int
    future: asyncio.Future
    completion: Completion
    rank: tuple[int, int] = (0, 0)  # (priority, arrival): lower is served first under priority scheduling


@dataclass
class SimStats:
    """What the scheduler did, in modelled (unscaled) seconds."""

    steps: int = 0
    busy_s: float = 0.0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    draft_tokens: int = 0  # speculation: tokens drafted and verified, and how many were accepted
    accepted_tokens: int = 0
    step_seconds: list[float] = field(default_factory=list)  # last 1000 modelled step durations


_DIGITS = re.compile(r"\d{2,}")
_TAG = {name: re.compile(rf"<{name}>\n(.*?)\n</{name}>", re.S) for name in ("memory", "section", "document")}


def _digit_sentences(text: str) -> list[str]:
    """Sentences of ``text`` holding a digit string, found from the digits outwards (cheap on long text)."""
    out, end = [], -1
    for m in _DIGITS.finditer(text):
        if m.start() < end:
            continue
        start = max(text.rfind(".", 0, m.start()), text.rfind("\n", 0, m.start())) + 1
        stop = min((i for i in (text.find(".", m.end()), text.find("\n", m.end())) if i >= 0), default=len(text) - 1)
        end = stop + 1
        sentence = text[start:end].strip()
        if sentence:
            out.append(sentence)
    return out


def _tag(text: str, name: str) -> str | None:
    m = _TAG[name].search(text)
    return m.group(1) if m else None


class LatencyEngine(Engine):
    """The engine interface over :class:`LatencyModel`: deterministic replies, modelled step times."""

    def __init__(self, model: LatencyModel | None = None, tokenizer: Any = None, *, name: str = "latency-model",
                 context_window: int = 131072):
        from memagent.bpe_offsets import tiktoken_bpe_for
        from memagent.models import load_tokenizer

        self.model = model or LatencyModel()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer("smollm2-135m")
        bpe = tiktoken_bpe_for(self.tokenizer)
        self._encode = bpe.encoding.encode_ordinary if bpe is not None else \
            (lambda s: self.tokenizer(s, add_special_tokens=False)["input_ids"])
        self.name, self.context_window = name, context_window
        self.stats = EngineStats()
        self.sim = SimStats()
        # Chat-template tokens around the message contents (constant per template).
        self._template_overhead = len(super().encode_chat([{"role": "user", "content": ""}]))
        self._waiting: deque[_Seq] = deque()
        self._arrivals = 0
        self._running: list[_Seq] = []
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._acceptance = Acceptance(self.model) if self.model.speculating else None

    # -- token accounting, cheap --
    def count_tokens(self, text: str) -> int:
        cpt = self.model.chars_per_token
        if cpt and len(text) > 4000:
            return max(1, round(len(text) / cpt))
        return len(self._encode(text))

    def count_chat_tokens(self, messages: Messages) -> int:
        return self._template_overhead * len(messages) + sum(self.count_tokens(m["content"]) for m in messages)

    def encode_chat(self, messages: Messages) -> list[int]:
        return super().encode_chat(messages)

    # -- queue depth for metrics --
    @property
    def queued(self) -> int:
        """Requests waiting for their first prefill token (not yet running)."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def reply(self, messages: Messages, max_tokens: int) -> tuple[str, int, str]:
        """Deterministic reply text, its token count and finish reason."""
        text = messages[-1]["content"]
        section = _tag(text, "section")
        memory = _tag(text, "memory") or ""
        if section is None:  # the answer (or full-context) conversation
            source = _tag(text, "document") or memory
            digits = _DIGITS.findall(source)
            out = f"Therefore, the answer is {digits[-1] if digits else 'none'}"
        else:
            kept, seen = [], set()
            for s in _digit_sentences(memory) + _digit_sentences(section):
                if s not in seen:
                    seen.add(s)
                    kept.append(s)
            out = " ".join(kept) if kept else "Nothing relevant yet."
        ids = self._encode(out)
        if len(ids) > max_tokens:
            return self.tokenizer.decode(ids[:max_tokens]), max_tokens, "length"
        return out, max(1, len(ids)), "stop"

    async def chat(self, messages: Messages, params: SamplingParams) -> Completion:
        text, n_out, finish = self.reply(messages, params.max_tokens)
        n_prompt = self.count_chat_tokens(messages)
        loop = asyncio.get_running_loop()
        completion = Completion(text=text, prompt_tokens=n_prompt, completion_tokens=n_out, finish_reason=finish)
        self._arrivals += 1
        rank = (params.priority if self.model.priority_scheduling else 0, self._arrivals)
        seq = _Seq(prefill_left=n_prompt, decode_left=n_out, future=loop.create_future(), completion=completion,
                   rank=rank)
        self._ensure_worker()
        self._waiting.append(seq)
        assert self._wake is not None
        self._wake.set()
        return await seq.future

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._wake = asyncio.Event()
            self._worker = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        m = self.model
        assert self._wake is not None
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
            # Admit waiting sequences while there is room (vLLM: running first, then waiting).
            if m.priority_scheduling and len(self._waiting) > 1:
                self._waiting = deque(sorted(self._waiting, key=lambda s: s.rank))
            while self._waiting and len(self._running) < m.max_seqs:
                self._running.append(self._waiting.popleft())
            if m.priority_scheduling:
                self._running.sort(key=lambda s: s.rank)  # prefill budget in priority order
            decoding = [s for s in self._running if s.prefill_left == 0]
            # Speculating, each decoding sequence drafts (never past its last token) and verifies.
            drafts = [self._draft(s) for s in decoding] if self._acceptance else [(0, 0)] * len(decoding)
            drafted = sum(d for d, _ in drafts)
            budget = m.max_tokens_per_step - len(decoding) - drafted
            prefill = 0
            for s in self._running:
                if s.prefill_left and budget > 0:
                    take = min(s.prefill_left, budget)
                    s.prefill_left -= take
                    budget -= take
                    prefill += take
                    if s.prefill_left == 0:  # the step that ends a prefill samples the first token
                        s.decode_left -= 1
                        s.completion.decode_steps += 1
            for s, (d, a) in zip(decoding, drafts):
                s.decode_left -= 1 + a
                s.completion.decode_steps += 1
                s.completion.draft_tokens += d
                s.completion.accepted_tokens += a
            dt = m.step_seconds(prefill + drafted, len(decoding))
            self.sim.steps += 1
            self.sim.busy_s += dt
            self.sim.prefill_tokens += prefill
            self.sim.decode_tokens += len(decoding) + sum(a for _, a in drafts)
            self.sim.draft_tokens += drafted
            self.sim.accepted_tokens += sum(a for _, a in drafts)
            if len(self.sim.step_seconds) >= 1000:
                del self.sim.step_seconds[:500]
            self.sim.step_seconds.append(dt)
            await asyncio.sleep(dt * m.time_scale)
            done = [s for s in self._running if s.prefill_left == 0 and s.decode_left <= 0]
            if done:
                self._running = [s for s in self._running if not (s.prefill_left == 0 and s.decode_left <= 0)]
                self.stats.batch_sizes[len(decoding)] += 1
                for s in done:
                    self.stats.count(s.completion)
                    if not s.future.done():
                        s.future.set_result(s.completion)

    def _draft(self, s: _Seq) -> tuple[int, int]:
        """(drafted, accepted) for this step of ``s``: a draft never reaches past the reply's last token."""
        assert self._acceptance is not None
        d, a = self._acceptance.draw()
        d = min(d, max(0, s.decode_left - 1))
        return d, min(a, d)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None


def from_config(config: dict[str, Any] | None = None) -> LatencyEngine:
    """Build a :class:`LatencyEngine` from plain data (``LatencyModel`` fields, plus ``name``)."""
    config = dict(config or {})
    name = config.pop("name", "latency-model")
    return LatencyEngine(LatencyModel(**config), name=name)


def engine_builder(config: dict[str, Any]) -> Callable[[Any], LatencyEngine]:
    """The batch job's ``build_engine``: a :class:`LatencyEngine` from ``config`` in each actor (the
    job's own engine config is not used)."""
    return functools.partial(_from_job, dict(config))


def _from_job(config: dict[str, Any], _engine_config: Any) -> LatencyEngine:
    return from_config(config)


def model_dict(model: LatencyModel) -> dict[str, Any]:
    return asdict(model)
