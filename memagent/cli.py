"""The ``memagent`` command.

Core commands live here (``ask``). Other layers add theirs through the entry-point group
``memagent.commands`` (each entry is a function ``add_commands(subparsers)``), so this module
never imports Ray or Prefect and ``memagent batch`` still comes from the same command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from importlib.metadata import entry_points
from pathlib import Path

from memagent.config import PRESETS, AgentConfig, preset
from memagent.engines import EngineConfig
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


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m", help="model name, HF directory or .gguf file")
    g.add_argument("--engine", default="hf", choices=["hf"], help="backend")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    g.add_argument("--max-batch-size", type=int, default=16, help="most requests per forward pass")


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
    return EngineConfig(engine=args.engine, model=args.model, device=args.device, dtype=args.dtype,
                        max_batch_size=args.max_batch_size)


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

    try:
        result = asyncio.run(read_document(engine, args.question, context, config, on_step=on_step))
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

    for ep in entry_points(group="memagent.commands"):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, ModelNotFoundError) as exc:  # bad configs, inputs, models: a message, not a traceback
        if args.verbose:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
