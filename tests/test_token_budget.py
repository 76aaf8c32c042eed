"""Budget checks run before a job starts: the engine's tokenizer and window, read without weights."""

from __future__ import annotations

import pytest

from memagent.agent import check_config
from memagent.config import AgentConfig
from memagent.engines import EngineConfig
from memagent.engines.budget import token_budget
from memagent.extraction import ExtractionSchema


def test_the_budget_counts_as_the_engine_it_describes(tiny_engine, tiny_llama_dir):
    budget = token_budget(EngineConfig(model=str(tiny_llama_dir)))
    messages = [{"role": "user", "content": "How many tokens is this question?"}]
    assert budget.context_window == tiny_engine.context_window
    assert budget.count_chat_tokens(messages) == tiny_engine.count_chat_tokens(messages)


def test_a_window_given_in_the_config_wins(tiny_llama_dir):
    assert token_budget(EngineConfig(model=str(tiny_llama_dir), context_window=1234)).context_window == 1234


@pytest.mark.parametrize("agent, problem", [
    (AgentConfig(chunk_tokens=3000, memory_tokens=1024), "context window of 4096"),
    (AgentConfig(preset="tiny", answer_tokens=256, query_tokens=96, extraction=ExtractionSchema.model_validate({"type": "object", "properties": {
        f"field_{i}": {"type": "string", "description": "a long description of what this field holds " * 4}
        for i in range(2)}})), "over query_tokens"),
])
def test_budgets_that_cannot_fit_are_refused_from_the_tokenizer_alone(tiny_llama_dir, agent, problem):
    with pytest.raises(ValueError, match=problem):
        check_config(token_budget(EngineConfig(model=str(tiny_llama_dir))), agent)


def test_the_batch_job_refuses_budgets_before_ray_starts(tiny_llama_dir, tmp_path):
    import ray

    from pipelines.batch_config import BatchQAConfig
    from pipelines.batch_qa import run_batch_qa
    from tests.pipeline_helpers import good_rows, write_rows

    write_rows(tmp_path / "in" / "part.parquet", good_rows(2))
    cfg = BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                        engine=EngineConfig(model=str(tiny_llama_dir)),
                        agent=AgentConfig(chunk_tokens=3000, memory_tokens=1024))
    with pytest.raises(ValueError, match="context window of 4096"):
        run_batch_qa(cfg)
    assert not ray.is_initialized(), "refused before Ray started or any model loaded"
