"""A chain resumes only on the stack that wrote it: the checkpoint key covers dtype, model, tokenizer, versions;
and only with the settings it was read with, a changed one named with its values."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from memagent.agent import ReadState, read_document
from memagent.config import AgentConfig
from memagent.data.demo import niah_row
from memagent.engines import EngineConfig
from pipelines.checkpoints import CheckpointLog

FAST = AgentConfig(chunk_tokens=48, memory_tokens=10, answer_tokens=6, query_tokens=64, temperature=0.0)


@pytest.fixture(scope="module")
def states(tiny_engine) -> list[ReadState]:
    row = niah_row(1, 300, depth=0.5, seed=4)
    out: list[ReadState] = []

    async def keep(state: ReadState) -> None:
        out.append(state)

    asyncio.run(read_document(tiny_engine, row["question"], row["context"], FAST, on_state=keep))
    return out


def changed(tmp_path, tiny_llama_dir, part: str) -> tuple[dict, dict]:
    """decode_parts before and after changing one ``part`` of the stack (the model files copied and edited)."""
    from pipelines.fingerprint import decode_parts

    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    before = decode_parts(EngineConfig(model=str(model), dtype="fp32"))
    cfg = EngineConfig(model=str(model), dtype="bf16" if part == "dtype" else "fp32")
    if part == "tokenizer":
        tok = next(p for p in model.iterdir() if p.name in ("tokenizer.json", "tokenizer_config.json"))
        tok.write_text(tok.read_text().replace("}", ' , "edited": 1}', 1) if tok.suffix == ".json" else "x")
    if part == "model":
        (model / "config.json").write_text((model / "config.json").read_text().replace("{", '{"edited": 1, ', 1))
    after = decode_parts(cfg)
    return before, after


@pytest.mark.parametrize("part", ["dtype", "model", "tokenizer"])
def test_a_chain_of_another_stack_is_not_resumed_and_the_part_is_named(tmp_path, tiny_llama_dir, states, part):
    """A log written under one stack is refused under a stack differing in one part, which the reason names."""
    from pipelines.fingerprint import checkpoint_key

    before, after = changed(tmp_path, tiny_llama_dir, part)
    assert before != after
    log = CheckpointLog(str(tmp_path / "out"), None, every_steps=1, every_s=3600)
    log.write("r", checkpoint_key("fp", before), states[2], 0)
    assert log.load("r", checkpoint_key("fp", before))[0] == states[2]  # the same stack resumes
    state, why = log.load("r", checkpoint_key("fp", after))
    assert state is None and f"stale: {part} differed" in why


def test_library_versions_are_in_the_key(tiny_llama_dir):
    """The key names the installed versions of the libraries that decode (an upgrade changes it)."""
    import json
    from importlib import metadata

    from pipelines.fingerprint import decode_parts

    versions = json.loads(decode_parts(EngineConfig(model=str(tiny_llama_dir)))["versions"])
    assert versions["torch"] == metadata.version("torch")
    assert versions["transformers"] == metadata.version("transformers")


def test_a_chain_read_with_other_settings_names_the_setting_and_its_values(tmp_path, states):
    """A log written with memory_heads 1 and read for memory_heads 2 is refused with "agent.memory_heads: 1 → 2",
    not only "the input or config"."""
    from pipelines.batch_config import BatchQAConfig
    from pipelines.fingerprint import checkpoint_key, settings_parts

    def key(heads: int) -> str:
        cfg = BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                            agent=AgentConfig(**{**FAST.model_dump(), "memory_tokens": 16, "memory_heads": heads}))
        return checkpoint_key(f"fp{heads}", settings_parts(cfg))  # the input fingerprint covers the settings too

    log = CheckpointLog(str(tmp_path / "out"), None, every_steps=1, every_s=3600)
    log.write("r", key(1), states[2], 0)
    assert log.load("r", key(1))[0] == states[2]
    state, why = log.load("r", key(2))
    assert state is None and "stale: agent.memory_heads: 1 → 2 differed" in why, why
