"""The ``memagent`` command.

Core commands live here (``ask``, ``serve``). Other layers add theirs through the entry-point group
``memagent.commands`` (each entry is a function ``add_commands(subparsers)``), so this module
never imports Ray or Prefect and ``memagent batch`` still comes from the same command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

from pydantic import ValidationError

from memagent.config import PRESETS, AgentConfig, preset
from memagent.engines import EngineConfig
from memagent.engines.openai import EndpointError
from memagent.models import ModelNotFoundError


def add_agent_options(parser: argparse.ArgumentParser, default_preset: str = "small") -> None:
    """Budget and decoding flags shared by every command that runs the agent."""
    g = parser.add_argument_group("agent")
    g.add_argument("--preset", default=default_preset, choices=sorted(PRESETS),
                   help=f"budget preset (default {default_preset}; 'paper' = 5000/1024/1024)")
    g.add_argument("--chunk-tokens", type=int, help="document tokens per memory update")
    g.add_argument("--memory-tokens", type=int, help="max tokens of the memory")
    g.add_argument("--answer-tokens", type=int, help="max tokens of the final answer")
    g.add_argument("--max-chunks", type=int, help="cap chunks per document (centre truncation)")
    g.add_argument("--answer-style", choices=["phrase", "boxed", "json"], help="how the final answer is asked for")
    g.add_argument("--temperature", type=float, help="0 = greedy (default)")


# Engine flags (argparse dest) -> EngineConfig fields. Every flag but --model defaults to None and
# only flags the user set reach EngineConfig: its defaults apply otherwise, and its check that an
# option belongs to the chosen backend sees real choices, never argparse defaults.
ENGINE_FLAGS = {
    "engine": "engine", "model": "model", "tokenizer": "tokenizer", "context_window": "context_window",
    "device": "device", "dtype": "dtype", "max_batch_size": "max_batch_size",
    "endpoint": "endpoint", "api_key_env": "api_key_env", "served_model": "served_model",
    "max_concurrency": "max_concurrency", "request_timeout": "request_timeout_s", "max_retries": "max_retries",
    "tensor_parallel_size": "tensor_parallel_size", "gpu_memory_utilization": "gpu_memory_utilization",
    "max_model_len": "max_model_len", "quantization": "quantization",
    "enable_prefix_caching": "enable_prefix_caching", "enable_sleep_mode": "enable_sleep_mode",
}
_FIELD_FLAGS = {field: "--" + dest.replace("_", "-") for dest, field in ENGINE_FLAGS.items()}
_FIELD_FLAGS.update(enable_prefix_caching="--no-prefix-caching", enable_sleep_mode="--sleep-mode")


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Backend selection (``--engine hf|vllm|openai``) and the options of each backend."""
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m",
                   help="model name, HF directory or .gguf file (openai: the local tokenizer and default served name)")
    g.add_argument("--engine", choices=["hf", "vllm", "openai"],
                   help="backend: hf = transformers here (default), vllm = vLLM here (GPU), openai = a remote endpoint")
    g.add_argument("--tokenizer", help="tokenizer (name or HF directory) when it differs from --model")
    g.add_argument("--context-window", type=int, help="override the model's context window (prompt + reply tokens)")
    g = parser.add_argument_group("engine: hf and vllm")
    g.add_argument("--device", help="auto (default), cpu, cuda, cuda:N")
    g.add_argument("--dtype", choices=["auto", "bf16", "fp16", "fp32"], help="default auto")
    g.add_argument("--max-batch-size", type=int, help="most requests per forward pass (default 16)")
    g = parser.add_argument_group("engine: openai")
    g.add_argument("--endpoint", help="base URL of an OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key (default OPENAI_API_KEY)")
    g.add_argument("--served-model", help="model name the endpoint serves (default: --model)")
    g.add_argument("--max-concurrency", type=int, help="most requests in flight (default 16)")
    g.add_argument("--request-timeout", type=float, metavar="SECONDS", help="timeout of one request (default 120)")
    g.add_argument("--max-retries", type=int, help="retries on 429/5xx/connection errors/timeouts (default 5)")
    g = parser.add_argument_group("engine: vllm")
    g.add_argument("--tensor-parallel-size", type=int, help="GPUs one engine shards the model over (default 1)")
    g.add_argument("--gpu-memory-utilization", type=float, help="fraction of GPU memory for the engine (default 0.85)")
    g.add_argument("--max-model-len", type=int, help="context length to allocate (default: the model's)")
    g.add_argument("--quantization", help="e.g. fp8, awq, gguf")
    g.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None,
                   help="do not reuse the KV cache of shared prompt prefixes")
    g.add_argument("--sleep-mode", dest="enable_sleep_mode", action="store_true", default=None,
                   help="allow sleep()/wake_up() (sharing a GPU with a trainer)")


def agent_config_from_args(args: argparse.Namespace) -> AgentConfig:
    return preset(args.preset).with_overrides(
        chunk_tokens=args.chunk_tokens,
        memory_tokens=args.memory_tokens,
        answer_tokens=args.answer_tokens,
        max_chunks=args.max_chunks,
        answer_style=args.answer_style,
        temperature=args.temperature,
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from the flags the user set; a bad combination is a ValueError naming the flags."""
    values = {field: getattr(args, dest) for dest, field in ENGINE_FLAGS.items() if getattr(args, dest, None) is not None}
    try:
        return EngineConfig(**values)
    except ValidationError as exc:
        raise ValueError(f"engine options: {_flag_errors(exc)}") from None


def _flag_errors(exc: ValidationError) -> str:
    """Pydantic's errors in the words of the command line (flags, not field names)."""
    parts = []
    for err in exc.errors():
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        for field, flag in _FIELD_FLAGS.items():  # model-level checks name fields in their message
            if field not in ("engine", "model"):  # too common as plain words
                msg = re.sub(rf"(?<![-\w]){field}\b", flag, msg)
        loc = [str(p) for p in err.get("loc", ())]
        parts.append(f"{_FIELD_FLAGS.get(loc[0], loc[0])}: {msg}" if loc else msg)
    return "; ".join(parts)


def read_context(path: str | None) -> str:
    """The document text from a file, or stdin for ``-``/no path; non-UTF-8 input is an error."""
    try:
        if path in (None, "-"):
            if sys.stdin.isatty():
                raise SystemExit("error: give --context-file PATH or pipe the document on stdin")
            data = sys.stdin.buffer.read()
            source = "stdin"
        else:
            data = Path(path).read_bytes()
            source = path
    except FileNotFoundError:
        raise SystemExit(f"error: --context-file {path}: no such file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SystemExit(
            f"error: {source} is not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
            "convert it first, e.g. iconv -f latin1 -t utf-8"
        ) from None


def cmd_ask(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from memagent.agent import InputError, check_config, read_document
    from memagent.engines import make_engine

    context = read_context(args.context_file)
    config = agent_config_from_args(args)
    engine = make_engine(engine_config_from_args(args))
    check_config(engine, config)
    bar = tqdm(desc="reading", unit="step", disable=not sys.stderr.isatty() or args.quiet)

    def on_step(step, total: int) -> None:
        bar.total = total
        bar.update(1)
        bar.set_postfix(chunk=step.chunk_index, tokens=step.completion_tokens)

    async def read_then_close():
        try:
            return await read_document(engine, args.question, context, config, on_step=on_step)
        finally:
            await engine.close()

    try:
        result = asyncio.run(read_then_close())
    except InputError as exc:
        raise SystemExit(f"error: {exc}") from None
    finally:
        bar.close()
    print(result.prediction if result.prediction is not None else result.response.strip())
    if args.trace_out:
        trace = {"question": args.question, "model": engine.name, "config": config.model_dump(), **result.to_dict()}
        Path(args.trace_out).write_text(json.dumps(trace, indent=2, ensure_ascii=False))
        print(f"trace: {args.trace_out} ({result.n_chunks} chunks, {result.context_tokens} tokens)", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Load a local engine and serve it over the OpenAI chat API until interrupted."""
    from memagent.engines import make_engine
    from memagent.serve import serve

    served_name, args.served_model = args.served_model, None  # the name we serve under, not an endpoint's
    config = engine_config_from_args(args)
    if config.engine == "openai":
        raise ValueError("serve runs a local engine: use --engine hf or vllm (openai would only proxy)")
    engine = make_engine(config)
    if served_name:
        engine.name = served_name
    print(f"serving {engine.name!r} ({config.engine}, context window {engine.context_window} tokens) "
          f"at http://{args.host}:{args.port}/v1", file=sys.stderr)
    serve(engine, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memagent", description="Read long documents with a fixed-size memory.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    ask = sub.add_parser("ask", help="answer a question about one document")
    ask.add_argument("--context-file", help="document to read (UTF-8); '-' or omitted = stdin")
    ask.add_argument("--question", required=True, help="the question")
    ask.add_argument("--trace-out", help="write the full memory trace as JSON here")
    ask.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_agent_options(ask)
    add_engine_options(ask)
    ask.set_defaults(func=cmd_ask)

    srv = sub.add_parser("serve", help="serve a local model over an OpenAI-compatible API (/v1/chat/completions)")
    srv.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1: this machine only)")
    srv.add_argument("--port", type=int, default=8000, help="default 8000")
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_options(srv)
    srv.set_defaults(func=cmd_serve)

    for ep in entry_points(group="memagent.commands"):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, ModelNotFoundError, EndpointError) as exc:  # configs, inputs, models, endpoints: a message
        if args.verbose:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
