"""Fixtures of the `memagent serve` tests: the tiny random Llama behind the app, served on loopback
(import ``engine`` and ``url`` into a test module to use them)."""

from __future__ import annotations

import pytest

from tests.test_serve_guard import running


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    return TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)), batch_wait_s=0.02, name="tiny-llama")


@pytest.fixture(scope="module")
def url(engine):
    from memagent.serve import create_app

    with running(create_app(engine, close_engine=False)) as url:
        yield url
