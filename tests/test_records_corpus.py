"""The generated statement corpus (benchmarks/records.py): deterministic, every case planted, gold keys unique."""

from memagent.data.records_corpus import statement


def test_statement_is_deterministic_and_plants_every_case():
    a, b = statement("d", 20_000, 5), statement("d", 20_000, 5)
    assert a["text"] == b["text"] and a["gold"] == b["gold"]
    assert statement("d", 20_000, 6)["text"] != a["text"]
    assert all(a["cases"][k] > 0 for k in ("plain", "alias", "amended", "triple"))
    keys = [(g["payer"], g["date"]) for g in a["gold"]]
    assert len(keys) == len(set(keys))
    lines = a["text"].split("\n")
    for g in a["gold"]:
        said = [lines[i] for i in g["lines"]]
        assert all(g["date"] in s for s in said)
        if g["kind"] == "amended":
            assert said[1].startswith("Amendment:") and said[1].endswith(f"corrected to {g['amount']}.")
        elif g["kind"] == "alias":
            role = next(r for r, n in a["aliases"].items() if n == g["payer"])
            assert said[0].startswith(f"The {role} paid") and g["payer"] not in said[0]
        else:
            assert g["payer"] in said[0] and f"paid {g['amount']} on {g['date']}" in said[0]
        if g["kind"] == "triple":
            assert len(said) == 3 and len({s.split(" paid")[1] for s in said}) == 1
    assert a["n_near_misses"] > 0 and a["quiet_regions"] > 0
