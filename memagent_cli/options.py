"""Flag groups shared by several commands: the agent's budgets, the engine, the Ray job, S3.

Each group is the flags of one typed config; the parsed values are kept on the namespace so
a handler builds its config with ``agent_config(args)`` and friends.
"""

from __future__ import annotations

import argparse
from typing import Any

from memagent.config import JOB_PRESET, AgentConfig
from memagent.engines import EngineConfig
from memagent_cli.flags import add_model_flags, build

CLI_PRESET = JOB_PRESET


def add_agent_flags(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = (), schema: bool = False) -> None:
    """The AgentConfig flags, ``--prompts FILE`` and (``schema``: commands that extract) ``--schema FILE|module:Model``."""
    if not schema:  # a records option: only commands that extract offer it
        exclude = (*exclude, "require_grounding", "ground_elsewhere")
    flags = add_model_flags(parser, AgentConfig, "agent", exclude=exclude, show_defaults=False,
                            help_overrides={"preset": f"Budget preset (default {CLI_PRESET}; paper = "
                                                      "5000/1024/1024); the flags below override it"})
    flags.group.add_argument("--prompts", metavar="FILE", help="TOML file of prompt templates: memory_update, "
                        "final_answer, optionally full_context (see docs/prompts/)")
    if schema:
        flags.group.add_argument("--schema", metavar="FILE|module:Model",
                                 help="extract: a JSON Schema file, or a Pydantic model as module:Model, of what to "
                                 "pull out of every document (typed columns, records; see docs/extraction.md); the "
                                 "field list is the question")
    parser.set_defaults(_agent_flags=flags)


def agent_config(args: argparse.Namespace, **overrides: Any) -> AgentConfig:
    """The AgentConfig the user asked for: preset, then flags, then ``overrides`` (non-None)."""
    values = args._agent_flags.values(args)
    values.setdefault("preset", CLI_PRESET)
    if getattr(args, "prompts", None):
        from memagent.prompts import load_prompts

        values["prompts"] = load_prompts(args.prompts)
    if getattr(args, "schema", None):
        from memagent.extraction import load_schema

        values["extraction"] = load_schema(args.schema)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return build(AgentConfig, values, "agent options")


def add_engine_flags(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    parser.set_defaults(_engine_flags=add_model_flags(parser, EngineConfig, "engine", exclude=exclude))


def engine_config(args: argparse.Namespace, *, drop: tuple[str, ...] = (), **overrides: Any) -> EngineConfig:
    """EngineConfig from the flags the user set (less ``drop``); a bad combination is a ValueError naming the flags."""
    values = {k: v for k, v in args._engine_flags.values(args).items() if k not in drop}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return build(EngineConfig, values, "engine options")


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    from pipelines.job import JobConfig

    parser.set_defaults(_job_flags=add_model_flags(parser, JobConfig, "Ray job"), starts_ray=True)


def add_s3_flags(parser: argparse.ArgumentParser) -> None:
    from pipelines.storage import S3Options

    parser.set_defaults(_s3_flags=add_model_flags(parser, S3Options, "S3"))


def job_config(args: argparse.Namespace) -> Any:
    from pipelines.job import JobConfig

    return build(JobConfig, args._job_flags.values(args), "job options")


def s3_options(args: argparse.Namespace) -> Any:
    from pipelines.storage import S3Options

    return build(S3Options, args._s3_flags.values(args) if hasattr(args, "_s3_flags") else {}, "S3 options")


def add_document_limits_flags(parser: argparse.ArgumentParser) -> None:
    from memagent.documents import DocumentLimits

    parser.set_defaults(_document_limits_flags=add_model_flags(parser, DocumentLimits, "documents input"))


def document_limits(args: argparse.Namespace) -> Any:
    from memagent.documents import DocumentLimits

    values = args._document_limits_flags.values(args) if hasattr(args, "_document_limits_flags") else {}
    return build(DocumentLimits, values, "document limits")
