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
    from memagent.data.hotpotqa import HotpotSynthConfig
    from memagent.data.ruler import RulerItems
    from pipelines.synthesize import SynthJob, write_hotpotqa, write_ruler

    source = tmp_path / "hotpot.json"
    source.write_text(json.dumps(_records(8)))
    essay = tmp_path / "essay.txt"
    essay.write_text(" ".join(f"Sentence number {i} is about {w}." for i, w in enumerate(["cats", "dogs", "ships"] * 200)))
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    sizes = [("docs", 30), ("tokens", 1500)]

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        hp = HotpotSynthConfig(source=str(source), num_docs=[30], tokens=[1500], samples=5, seed=5)
        _, n = write_hotpotqa(hp, str(tmp_path / "hp"), str(smollm2_dir), SynthJob(ray=True, workers=1))
        items = RulerItems(tasks=["vt", "niah_single_2"], lengths=[2048], samples=3, seed=5, haystack=str(essay))
        _, m = write_ruler(items, str(tmp_path / "ruler"), str(smollm2_dir), SynthJob(ray=True, workers=2))
    finally:
        ray.shutdown()

    got = sorted(pq.read_table(tmp_path / "hp").to_pylist(), key=lambda r: r["id"])
    want = sorted(synthesize(load_hotpotqa(str(source)), sizes, seed=5, samples=5, tokenizer=tok), key=lambda r: r["id"])
    assert n == len(got) == 10 and got == want

    got_r = sorted(pq.read_table(tmp_path / "ruler").to_pylist(), key=lambda r: r["id"])
    gen = RulerGenerator(tok, essay=essay.read_text(), seed=5)
    want_r = sorted(gen.generate(["vt", "niah_single_2"], [2048], 3), key=lambda r: r["id"])
    assert m == len(got_r) == 6 and got_r == want_r
