"""The LangExtract side of ``benchmarks.langextract_peer``: runs in LangExtract's own venv.

    PY -I benchmarks/_langextract_child.py --text DOC.txt --base-url http://127.0.0.1:PORT/v1 --out OUT.json

Imports only LangExtract and the standard library (the project is not installed there). Calls
``langextract.extract`` with its defaults (chunking, passes, workers, schema constraints, fences)
through its OpenAI provider, pointed at ``--base-url``, with one example: a payment record with
the attributes payer/date/amount/bank. Writes every extraction with its char span, LangExtract's
version and defaults, the wall of ``extract`` and this process's peak RSS.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import resource
import time
from pathlib import Path

PROMPT = ("Extract every payment that was actually made, in order of appearance: the payer (the full company "
          "name; resolve a role such as 'the Carrier' to the company it stands for), the date, the amount and "
          "the bank if one is named. An amendment that corrects a payment's amount is a payment with the "
          "corrected amount. Invoices, quotes, planned and disputed payments are not payments. Use exact text "
          "from the input for extraction_text.")
EXAMPLE_TEXT = "Ashford Cables Ltd paid 1200 on 2020-01-05 via Northbank. The hall was repainted in May."
SETTINGS = ("max_char_buffer", "extraction_passes", "max_workers", "batch_length", "context_window_chars",
            "use_schema_constraints", "fence_output", "temperature")


def rss_mb() -> float:
    """This process's peak RSS: VmHWM (its own address space; ``ru_maxrss`` would carry the forking
    parent's peak across exec), else ``ru_maxrss``."""
    try:
        line = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM:"))
        return round(int(line.split()[1]) / 1024, 1)
    except (OSError, StopIteration, ValueError):
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import langextract as lx
    from langextract import extraction

    text = Path(args.text).read_text()
    example = lx.data.ExampleData(text=EXAMPLE_TEXT, extractions=[lx.data.Extraction(
        extraction_class="payment", extraction_text="Ashford Cables Ltd paid 1200 on 2020-01-05 via Northbank.",
        attributes={"payer": "Ashford Cables Ltd", "date": "2020-01-05", "amount": "1200", "bank": "Northbank"})])
    defaults = {k: inspect.signature(extraction.extract).parameters[k].default for k in SETTINGS}
    rss_before = rss_mb()
    t0 = time.perf_counter()
    doc = lx.extract(text, prompt_description=PROMPT, examples=[example], model_id="gpt-4o-mini",
                     api_key="oracle-needs-no-key", language_model_params={"base_url": args.base_url},
                     show_progress=False)
    wall = time.perf_counter() - t0
    out = {
        "langextract_version": importlib.metadata.version("langextract"),
        "openai_version": importlib.metadata.version("openai"),
        "settings": defaults, "model_id": "gpt-4o-mini (the oracle answers for any id)",
        "extract_wall_s": round(wall, 2), "rss_before_extract_mb": rss_before, "peak_rss_mb": rss_mb(),
        "extractions": [{
            "class": e.extraction_class, "text": e.extraction_text, "attributes": e.attributes,
            "char_interval": [e.char_interval.start_pos, e.char_interval.end_pos] if e.char_interval else None,
            "alignment": e.alignment_status.value if e.alignment_status else None,
        } for e in doc.extractions or []],
    }
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
