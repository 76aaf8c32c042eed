"""Output upkeep: ``memagent repair-output`` (one row per id in a batch output)."""

from __future__ import annotations

import argparse

from memagent_cli.flags import add_model_flags, build
from memagent_cli.options import add_s3_flags, s3_options


def cmd_repair_output(args: argparse.Namespace) -> int:
    from pipelines.repair import RepairConfig, repair_output

    cfg = build(RepairConfig, {**args._repair_flags.values(args), "s3": s3_options(args)}, "repair options")
    print(repair_output(cfg).line())
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from pipelines.repair import RepairConfig

    rep = sub.add_parser("repair-output", parents=[common],
                         help="keep one row per id in a batch output that holds duplicates (the newest complete row)")
    rep.set_defaults(func=cmd_repair_output,
                     _repair_flags=add_model_flags(rep, RepairConfig, "output", required=("output",)))
    add_s3_flags(rep)
