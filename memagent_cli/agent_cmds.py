"""``memagent ask`` (one document, one question) and ``memagent serve`` (a local engine over HTTP)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from memagent_cli.flags import add_model_flags, build
from memagent_cli.options import add_agent_flags, add_engine_flags, add_s3_flags, agent_config, engine_config, s3_options


def read_context(path: str | None) -> str:
    """The document text from a file, or stdin for ``-``/no path; non-UTF-8 input is an error."""
    if path in (None, "-"):
        if sys.stdin.isatty():
            raise ValueError("give --context-file PATH or pipe the document on stdin")
        data, source = sys.stdin.buffer.read(), "stdin"
    else:
        try:
            data, source = Path(path).read_bytes(), path
        except FileNotFoundError:
            raise ValueError(f"--context-file {path}: no such file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{source} is not valid UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r}); "
            "convert it first, e.g. iconv -f latin1 -t utf-8"
        ) from None


def cmd_ask(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from memagent.agent import check_config, read_document
    from memagent.engines import make_engine

    context = read_context(args.context_file)
    config = agent_config(args)
    engine = make_engine(engine_config(args))
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
    from memagent.serve import ServeConfig, serve

    config = engine_config(args, drop=("served_model",))
    if config.engine == "openai":
        raise ValueError("serve runs a local engine: use --engine hf or vllm (openai would only proxy)")
    server = build(ServeConfig, args._serve_flags.values(args), "server options")
    server.auth_key()  # an unset key variable fails before the model loads
    agent = agent_config(args)  # how the memagent model reads
    engine = make_engine(config)
    if args.served_model:  # the name we serve under, not an endpoint's
        engine.name = args.served_model
    key = f" (clients send the key in ${server.auth_key_env})" if server.auth_key_env else ""
    print(f"serving {engine.name!r} ({config.engine}, context window {engine.context_window} tokens) "
          f"at http://{server.host}:{server.port}/v1{key}", file=sys.stderr)
    if server.memagent_model:
        print(f"also serving the memory agent as {server.memagent_model!r}", file=sys.stderr)
    routers, on_startup = _batch_routes(args, config, agent, engine, server)
    serve(engine, server, agent, extra_routers=routers, on_startup=on_startup)
    return 0


def _batch_routes(args: argparse.Namespace, config: Any, agent: Any, engine: Any, server: Any) -> tuple[list, list]:
    """(/v1/files and /v1/batches when --batch-root is set, the hook that starts their runner on the server's loop:
    unfinished batches there resume then, their lines answered by the server's own engine)."""
    if not args.batch_root:
        return [], []
    from pipelines.openai_batch import BatchRunConfig
    from pipelines.openai_batch_api import BatchService, batch_router

    # The lines are answered as this server answers its chat requests: same models, limits and reasoning field.
    cfg = BatchRunConfig(engine=config, agent=agent, engine_model=engine.name, max_tokens=server.max_tokens,
                         s3=s3_options(args), memagent_model=server.memagent_model or None,
                         reasoning_field=server.reasoning_field)
    print(f"batches: /v1/files and /v1/batches, state under {args.batch_root}", file=sys.stderr)
    service = BatchService(args.batch_root, cfg, engine=engine)
    return [batch_router(service)], [service.start]


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    ask = sub.add_parser("ask", parents=[common], help="answer a question about one document")
    ask.add_argument("--context-file", help="document to read (UTF-8); '-' or omitted = stdin")
    ask.add_argument("--question", required=True, help="the question")
    ask.add_argument("--trace-out", help="write the full memory trace (and the config in force) as JSON here")
    ask.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_agent_flags(ask)
    add_engine_flags(ask)
    ask.set_defaults(func=cmd_ask)

    srv = sub.add_parser("serve", parents=[common],
                         help="serve a local model over an OpenAI-compatible API (/v1/chat/completions)")
    from memagent.serve import ServeConfig

    srv.set_defaults(_serve_flags=add_model_flags(srv, ServeConfig, "server"))
    srv.add_argument("--batch-root", help="serve OpenAI's Batch API (/v1/files, /v1/batches; docs/serve-batches.md) "
                     "with files and batch state under this local path or s3:// prefix")
    add_s3_flags(srv)
    add_agent_flags(srv)
    add_engine_flags(srv)
    srv.set_defaults(func=cmd_serve)
