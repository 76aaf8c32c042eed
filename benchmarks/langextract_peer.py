"""LangExtract peer row of the records benchmark: its architecture against an oracle, not a model.

    nice python -m benchmarks.langextract_peer --langextract-python PY --sizes 8192,65536,262144 \\
        --out benchmarks/results/records.json

``PY`` is the python of a separate venv with ``langextract`` (and ``openai``, its OpenAI
provider's client) installed; the project is not installed there and this path is written
nowhere. The documents are the records benchmark's (``statement("stmt-SIZE", SIZE, 32)``, the
same ones as its ``scripted`` row).

What it measures: the same thing as the ``scripted`` row, for LangExtract. That row answers each
call with a test double that reads the planted sentences of the text it is shown; here an
**oracle** behind an OpenAI-compatible endpoint on 127.0.0.1 (``/v1/chat/completions``) answers
each LangExtract prompt with the payments that *the chunk in that prompt* states (the regexes of
:mod:`benchmarks.records`: PAY, AMEND, INTRO), in the format LangExtract's prompt asks for
(``{"extractions": [{"payment": <exact sentence>, "payment_attributes": {...}}]}``, fenced only
if the prompt's example is). The chunk is the text after the prompt's last ``Q: `` (the few-shot
example above it is never read). A role ("The Carrier paid ...") is resolved only when its
introduction ("... (hereinafter the Carrier)") is in the same chunk (LangExtract carries nothing
between chunks by default; our double resolves it through the memory it is shown); an amendment
sentence gives a record with the corrected amount, as our double's records call does. So every
difference from the ``scripted`` row is the architecture's: per-chunk calls without a memory, no
merge of the records across chunks.

LangExtract runs in a child process (``benchmarks/_langextract_child.py``) with its defaults
(``max_char_buffer`` 1000, one pass, 10 workers, schema constraints from the example); its
extractions (with char spans) become records (payer, date, amount, bank; one mention each: no
merge) scored by :func:`benchmarks.records.score`. Per size: recall, precision, duplicate keys
(a payment returned more than once), amount exact match, per-case results, what the oracle was
asked (calls, prompt characters), wall and the child's peak RSS. The result replaces the key
``langextract`` of ``--out`` (the other keys are kept). A measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

from benchmarks.common import loadavg, print_table, write_json
from benchmarks.records import AMEND, INTRO, PAY, ROOT, SEED, _key, score

CHILD = ROOT / "benchmarks" / "_langextract_child.py"
CLASS = "payment"  # the example's extraction class: replies use it and its "_attributes" key


# ---------------------------------------------------------------- the oracle (pure logic)


def prompt_chunk(prompt: str) -> str:
    """The chunk LangExtract put in ``prompt``: its render ends ``"\\nQ: " + chunk + "\\nA: "``, after
    the description and the few-shot examples (each ``Q: ... A: ...``), so the text after the last
    ``Q: `` line is the chunk and never an example."""
    body = prompt[: -len("\nA: ")] if prompt.endswith("\nA: ") else prompt.rsplit("\nA:", 1)[0]
    i = body.rfind("\nQ: ")
    return body[i + len("\nQ: "):] if i >= 0 else body.removeprefix("Q: ")


def oracle_extractions(chunk: str) -> tuple[list[dict[str, Any]], int]:
    """The planted payments ``chunk`` states, in text order, as LangExtract extraction items; and the
    number of payments by a role whose introduction is not in ``chunk`` (left out: not resolvable)."""
    aliases = {role: name for name, role in INTRO.findall(chunk)}
    found: list[tuple[int, dict[str, Any]]] = []
    unresolved = 0
    for m in PAY.finditer(chunk):
        payer = m["payer"] or aliases.get(m["role"])
        if payer is None:
            unresolved += 1
            continue
        attrs = {"payer": payer, "date": m["date"], "amount": m["amount"]} | ({"bank": m["bank"]} if m["bank"] else {})
        found.append((m.start(), {CLASS: m[0], f"{CLASS}_attributes": attrs}))
    for m in AMEND.finditer(chunk):
        found.append((m.start(), {CLASS: m[0], f"{CLASS}_attributes":
                                  {"payer": m["payer"], "date": m["date"], "amount": m["amount"]}}))
    return [item for _, item in sorted(found, key=lambda x: x[0])], unresolved


def oracle_reply(prompt: str) -> tuple[str, dict[str, int]]:
    """The reply to one LangExtract prompt (JSON with ``extractions``; fenced as its example is) and stats."""
    chunk = prompt_chunk(prompt)
    items, unresolved = oracle_extractions(chunk)
    text = json.dumps({"extractions": items}, indent=2)
    if "```json" in prompt[: len(prompt) - len(chunk)]:
        text = f"```json\n{text}\n```"
    return text, {"prompt_chars": len(prompt), "chunk_chars": len(chunk), "reply_chars": len(text),
                  "extractions": len(items), "unresolved_roles": unresolved}


# ---------------------------------------------------------------- the oracle's endpoint


class Oracle:
    """An OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 that answers with ``reply`` (a prompt ->
    ``(text, stats)`` function; :func:`oracle_reply` by default)."""

    def __init__(self, reply: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []
        answer = reply or oracle_reply
        self.lock = threading.Lock()
        oracle = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                user = [m for m in body.get("messages", []) if m.get("role") == "user"]
                content = user[-1]["content"] if user else ""
                text, stats = answer(content if isinstance(content, str) else json.dumps(content))
                stats["response_format"] = (body.get("response_format") or {}).get("type", "none")
                with oracle.lock:
                    oracle.calls.append(stats)
                self._send(200, {"id": f"oracle-{len(oracle.calls)}", "object": "chat.completion",
                                 "created": int(time.time()), "model": body.get("model", "oracle"),
                                 "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                              "message": {"role": "assistant", "content": text, "refusal": None}}]})

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- extractions -> records, scoring


@dataclass
class Span:
    char_start: int | None
    char_end: int | None


@dataclass
class PeerRecord:
    """What :func:`benchmarks.records.score` reads: ``values``, ``mentions``, ``evidence``."""

    values: dict[str, Any]
    mentions: int = 1  # LangExtract does not merge: each extraction is one record of one mention
    evidence: dict[str, Span] = field(default_factory=dict)
    text: str = ""  # the extraction text (the sentence the oracle returned)


def to_records(extractions: list[dict[str, Any]]) -> list[PeerRecord]:
    out = []
    for e in extractions:
        if e["class"] != CLASS:
            continue
        a = e.get("attributes") or {}
        values: dict[str, Any] = {"payer": a.get("payer"), "date": a.get("date")}
        try:
            values["amount"] = int(str(a.get("amount")).replace(",", ""))
        except ValueError:
            values["amount"] = a.get("amount")
        if a.get("bank"):
            values["bank"] = {"name": a["bank"]}
        span = e.get("char_interval") or [None, None]
        out.append(PeerRecord(values, evidence={CLASS: Span(span[0], span[1])}, text=e["text"]))
    return out


def case_details(doc: dict[str, Any], records: list[PeerRecord]) -> dict[str, Any]:
    """What the per-key score hides: records per payment, conflicting amounts, the spans' text."""
    by_key: dict[tuple[str, str], list[PeerRecord]] = {}
    for r in records:
        by_key.setdefault(_key(r.values.get("payer"), r.values.get("date")), []).append(r)
    gold = {_key(g["payer"], g["date"]): g for g in doc["gold"]}

    def of(kind: str) -> list[tuple[dict[str, Any], list[PeerRecord]]]:
        return [(g, by_key.get(k, [])) for k, g in gold.items() if g["kind"] == kind]

    amended, triples = of("amended"), of("triple")
    text = doc["text"]
    spans = [r.evidence[CLASS] for r in records]
    return {
        "records_per_triple_payment": dict(sorted(Counter(len(rs) for _, rs in triples).items())),
        "amended_keys_with_conflicting_amounts": sum(len({r.values.get("amount") for r in rs}) > 1 for _, rs in amended),
        "amended_corrected_amount_among_records": sum(any(r.values.get("amount") == g["amount"] for r in rs)
                                                      for g, rs in amended),
        "distinct_keys_not_in_gold": sum(k not in gold for k in by_key),
        "keys_with_conflicting_amounts": sum(len({r.values.get("amount") for r in rs}) > 1 for rs in by_key.values()),
        "extractions_without_span": sum(s.char_start is None for s in spans),
        "spans_whose_text_is_the_sentence_returned": sum(
            s.char_start is not None and text[s.char_start:s.char_end] == r.text for s, r in zip(spans, records)),
        "missed": [{k: g[k] for k in ("payer", "date", "amount", "kind")} for k, g in gold.items() if k not in by_key][:8],
    }


# ---------------------------------------------------------------- parent


def run_size(py: str, size: int, oracle: Oracle, work: Path, timeout: float) -> dict[str, Any]:
    from memagent.data.records_corpus import statement

    doc = statement(f"stmt-{size}", size, SEED)
    tp, op, ep = work / f"doc-{size}.txt", work / f"le-{size}.json", work / f"le-{size}.stderr"
    tp.write_text(doc["text"])
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
           "OPENAI_API_KEY": "oracle-needs-no-key"}
    with oracle.lock:
        oracle.calls.clear()
    la = loadavg()
    t0 = time.perf_counter()
    try:
        with ep.open("w") as err:
            rc = subprocess.run([py, "-I", str(CHILD), "--text", str(tp), "--base-url", oracle.base_url, "--out", str(op)],
                                cwd=ROOT, env=env, stderr=err, stdout=err, timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    wall = round(time.perf_counter() - t0, 2)
    calls = list(oracle.calls)
    stderr = ep.read_text(errors="replace")
    r: dict[str, Any] = {"target_tokens": size, "id": doc["id"], "chars": len(doc["text"]), "cases_planted": doc["cases"],
                         "near_misses": doc["n_near_misses"], "child_rc": rc, "child_wall_s": wall,
                         "loadavg_before": la, "loadavg_after": loadavg(),
                         "chunks_omitted_parse_error": stderr.count("Chunk omitted")}
    if rc != 0 or not op.exists():
        tail = stderr[-1500:].replace(str(Path(py).resolve().parent.parent), "<langextract venv>").replace(py, "PY").replace(str(ROOT), ".")
        return r | {"error": f"child rc {rc}", "stderr_tail": tail}
    child = json.loads(op.read_text())
    records = to_records(child["extractions"])
    s = score(doc, records)
    r |= {k: child[k] for k in ("langextract_version", "openai_version", "settings", "extract_wall_s",
                                 "rss_before_extract_mb", "peak_rss_mb")}
    r["calls"] = {"n": len(calls), "prompt_chars": sum(c["prompt_chars"] for c in calls),
                  "prompt_chars_mean": round(sum(c["prompt_chars"] for c in calls) / max(len(calls), 1), 1),
                  "chunk_chars_mean": round(sum(c["chunk_chars"] for c in calls) / max(len(calls), 1), 1),
                  "prompt_chars_per_document_char": round(sum(c["prompt_chars"] for c in calls) / len(doc["text"]), 3),
                  "oracle_extractions": sum(c["extractions"] for c in calls),
                  "role_payments_left_unresolved": sum(c["unresolved_roles"] for c in calls),
                  "response_format": dict(Counter(c["response_format"] for c in calls))}
    r["alignment"] = dict(Counter(e["alignment"] for e in child["extractions"]))
    r["any_extraction_without_span"] = any(e["char_interval"] is None for e in child["extractions"])
    r["score"] = s
    r["details"] = case_details(doc, records)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--langextract-python", required=True, help="the python of a venv with langextract and openai")
    ap.add_argument("--sizes", default="8192,65536", help="documents' target tokens")
    ap.add_argument("--out", default="benchmarks/results/records.json")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per size")
    args = ap.parse_args()
    out_path = Path(args.out)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    work = Path(tempfile.mkdtemp(prefix="langextract-peer-"))
    peer: dict[str, Any] = {
        "run": True,
        "label": "LangExtract's pipeline against an oracle endpoint (answers each prompt from the planted sentences "
                 "of the chunk in it; measures the architecture, not a model)",
        "command": f"nice python -m benchmarks.langextract_peer --langextract-python PY --sizes {args.sizes} --out {args.out}",
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "loadavg_before": loadavg(),
        "oracle": "OpenAI-compatible /v1/chat/completions on 127.0.0.1; chunk = text after the prompt's last 'Q: '; "
                  "regexes PAY/AMEND/INTRO of benchmarks.records; a role resolves only if introduced in the same chunk",
        "documents": []}
    rows = []
    with Oracle() as oracle:
        for size in sizes:
            r = run_size(args.langextract_python, size, oracle, work, args.timeout)
            peer["documents"].append(r)
            for k in ("langextract_version", "openai_version", "settings"):
                if k in r:
                    peer[k] = r.pop(k)
            peer["loadavg_after"] = loadavg()
            data = json.loads(out_path.read_text()) if out_path.exists() else {"benchmark": "records", "seed": SEED}
            data["langextract"] = peer
            write_json(out_path, data)
            if "score" not in r:
                print(f"langextract {size}: {r['error']}\n{r['stderr_tail']}", flush=True)
                rows.append([size, r["chars"], "error", "", "", "", "", "", "", "", "", r["child_wall_s"], ""])
                continue
            s, c = r["score"], r["score"]["cases"]
            rows.append([size, r["chars"], r["calls"]["n"], s["gold"], s["predicted"], s["recall"], s["precision"],
                         s["duplicate_keys"], f"{s['amount_exact'][0]}/{s['amount_exact'][1]}",
                         f"{c.get('alias', {}).get('found', 0)}/{c.get('alias', {}).get('gold', 0)}",
                         r["any_extraction_without_span"], r["child_wall_s"], r["peak_rss_mb"]])
            print(f"langextract {size}: done in {r['child_wall_s']} s", flush=True)
    print(f"LangExtract {peer.get('langextract_version')} against the oracle; settings {peer.get('settings')}")
    print_table(["target tokens", "chars", "calls", "gold", "records", "recall", "precision", "duplicate keys",
                 "amount EM", "alias found", "span missing", "wall s", "peak RSS MB"], rows)


if __name__ == "__main__":
    main()
