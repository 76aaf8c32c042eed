"""AgentConfig validation and window checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from memagent.config import PRESETS, AgentConfig, preset


@pytest.mark.parametrize("field", ["chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens", "max_chunks"])
@pytest.mark.parametrize("value", [0, -5])
def test_non_positive_sizes_rejected(field, value):
    with pytest.raises(ValidationError, match=field):
        AgentConfig(**{field: value})


def test_unknown_field_and_style_rejected():
    with pytest.raises(ValidationError):
        AgentConfig(chunk_size=5)
    with pytest.raises(ValidationError):
        AgentConfig(answer_style="essay")


def test_memory_far_larger_than_chunk_rejected():
    with pytest.raises(ValidationError, match="memory_tokens"):
        AgentConfig(chunk_tokens=100, memory_tokens=1000)


def test_paper_defaults():
    c = PRESETS["paper"]
    assert (c.chunk_tokens, c.memory_tokens, c.answer_tokens, c.query_tokens) == (5000, 1024, 1024, 1024)
    assert c.max_chunks is None


def test_check_fits_says_what_to_change():
    c = PRESETS["paper"]
    c.check_fits(context_window=32768, template_tokens=200)
    with pytest.raises(ValueError, match=r"lower chunk_tokens to \d+"):
        c.check_fits(context_window=8192, template_tokens=200)


def test_overrides_and_presets():
    c = preset("small").with_overrides(chunk_tokens=300, memory_tokens=None)
    assert c.chunk_tokens == 300 and c.memory_tokens == PRESETS["small"].memory_tokens
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")
    with pytest.raises(ValidationError):
        preset("small").with_overrides(answer_tokens=-1)
