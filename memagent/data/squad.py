"""SQuAD's official JSON (v2.0 or v1.1) read into answerable questions, for RULER's ``qa_1`` task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SquadQA:
    id: str
    question: str
    answers: tuple[str, ...]
    paragraph: str
    article: tuple[str, ...]  # every paragraph of the same article


def parse_squad(data: Any, source: str = "<squad>") -> list[SquadQA]:
    """Answerable questions of an official SQuAD (v2.0 or v1.1) JSON; errors name the place."""
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError(f"{source}: expected a SQuAD object with a 'data' list of articles")
    out: list[SquadQA] = []
    for a, article in enumerate(data["data"]):
        paras = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paras, list):
            raise ValueError(f"{source}: data[{a}] has no 'paragraphs' list")
        for p, para in enumerate(paras):
            if not isinstance(para, dict) or not isinstance(para.get("context"), str) or not para["context"].strip():
                raise ValueError(f"{source}: data[{a}].paragraphs[{p}]: field 'context' is missing or empty")
        texts = tuple(dict.fromkeys(para["context"] for para in paras))
        for p, para in enumerate(paras):
            for q, qa in enumerate(para.get("qas") or []):
                where = f"{source}: data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict) or not isinstance(qa.get("question"), str) or not qa["question"].strip():
                    raise ValueError(f"{where}: field 'question' is missing or empty")
                answers = qa.get("answers") or []
                if not isinstance(answers, list) or not all(isinstance(x, dict) and isinstance(x.get("text"), str) for x in answers):
                    raise ValueError(f"{where}: field 'answers' must be a list of {{'text': ...}}")
                texts_ = tuple(dict.fromkeys(x["text"].strip() for x in answers if x["text"].strip()))
                if qa.get("is_impossible") or not texts_:
                    continue
                qid = str(qa.get("id", f"{a}-{p}-{q}"))
                out.append(SquadQA(qid, qa["question"].strip(), texts_, para["context"], texts))
    if not out:
        raise ValueError(f"{source}: no answerable questions")
    return out
