"""The Ray Data synthesis jobs produce exactly what a single-process run produces."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest


def _records(n: int) -> list[dict]:
    words = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
    out = []
    for q in range(n):
        context = [[f"T{q}-{p}", [" ".join(words[(q + p + i) % len(words)] for i in range(30)) + "."]] for p in range(10)]
        out.append({"_id": f"q{q}", "question": f"Q{q}?", "answer": f"a{q}",
                    "supporting_facts": [[context[0][0], 0], [context[5][0], 0]], "context": context})
    return out


@pytest.mark.slow
def test_ray_jobs_match_local_runs(tmp_path: Path, smollm2_dir: Path):
    import ray
    from transformers import AutoTokenizer

    from memagent.data.hotpotqa import load_hotpotqa, synthesize
    from memagent.data.ruler import RulerGenerator
    from pipelines.synthesize import synthesize_hotpotqa, synthesize_ruler

    source = tmp_path / "hotpot.json"
    source.write_text(json.dumps(_records(8)))
    essay = tmp_path / "essay.txt"
    essay.write_text(" ".join(f"Sentence number {i} is about {w}." for i, w in enumerate(["cats", "dogs", "ships"] * 200)))
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    sizes = [("docs", 30), ("tokens", 1500)]

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        n = synthesize_hotpotqa(str(source), str(tmp_path / "hp"), sizes, samples=5, seed=5, tokenizer=str(smollm2_dir), workers=1)
        m = synthesize_ruler(["vt", "niah_single_2"], [2048], str(tmp_path / "ruler"), samples=3, seed=5,
                             tokenizer=str(smollm2_dir), haystack=str(essay), workers=2)
    finally:
        ray.shutdown()

    got = sorted(pq.read_table(tmp_path / "hp").to_pylist(), key=lambda r: r["id"])
    want = sorted(synthesize(load_hotpotqa(str(source)), sizes, seed=5, samples=5, tokenizer=tok), key=lambda r: r["id"])
    assert n == len(got) == 10 and got == want

    got_r = sorted(pq.read_table(tmp_path / "ruler").to_pylist(), key=lambda r: r["id"])
    gen = RulerGenerator(tok, essay=essay.read_text(), seed=5)
    want_r = sorted(gen.generate(["vt", "niah_single_2"], [2048], 3), key=lambda r: r["id"])
    assert m == len(got_r) == 6 and got_r == want_r
