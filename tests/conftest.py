"""Shared fixtures: the packaged model, a tiny Llama built from a config, engines on both.

Marking rule: a test is ``slow`` when it starts a service or a process (Ray, Prefect, DeepSpeed,
a server, a browser, a subprocess of the command) or reads with the packaged model; everything
else runs in ``make test-fast`` (pytest -m "not slow"). pytest prints the slowest tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# No network here and nothing may come from a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Every Ray the suite starts (in process, or by a command it runs) inherits this: Ray Data reads parquet
# footers with one actor instead of up to 32 (each a Python process, ~1 s of CPU, per job; the suite runs
# some hundred jobs on two cores). Ray's idle workers stay prestarted: without them a worker may still be
# importing when a test's Ctrl-C reaches the process group, and prints the KeyboardInterrupt it got.
os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
import pipelines  # noqa: E402,F401 - a local Ray binds 127.0.0.1 (set before ray is imported)

pytest_plugins = ["tests.scheduling"]  # files run longest first under make test


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """HF directory of the packaged SmolLM2-135M-Instruct (materialised from its GGUF once)."""
    from memagent.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A 2-layer, 64-wide random Llama with SmolLM2's tokenizer and chat template: fast, no weights."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray of 2 CPUs for one test module (modules needing more set-up define their own)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local_s3():
    """A local Ray of 2 CPUs whose workers carry moto's fake S3 credentials: the S3 tests' credentials reach a
    job's workers only through the environment the Ray they run in started with (it starts before a test sets
    them). Address "local": never another test's `ray start` cluster (pytest-xdist runs two files at once)."""
    import ray

    from infra.local_s3 import CREDENTIALS

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": dict(CREDENTIALS)})
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir: Path):
    """One transformers engine on the packaged model for the whole session."""
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    return TransformersEngine.from_config(EngineConfig(model=str(smollm2_dir)), name="smollm2-135m")


@pytest.fixture(scope="session")
def tiny_engine(tiny_llama_dir: Path):
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    return TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)), name="tiny-llama")


