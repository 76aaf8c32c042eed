"""The ``memagent`` command: one parser, one error convention.

Every subcommand lives in this package (``agent_cmds``, ``job_cmds``, ``data_cmds``,
``train_cmds``) and takes its flags from the typed configs (``memagent_cli.flags``). A user
error — bad flags, bad input, a missing file, an unreachable endpoint — prints one line and
exits 2; Ctrl-C exits 130 and says how to resume. ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import signal
import sys
import threading

from pydantic import ValidationError

from memagent_cli import agent_cmds, batch_api_cmds, data_cmds, job_cmds, output_cmds, train_cmds
from memagent_cli.quiet import known_lines_dropped, quiet_ray

COMMAND_MODULES = (agent_cmds, job_cmds, batch_api_cmds, data_cmds, train_cmds, output_cmds)


def common_options() -> argparse.ArgumentParser:
    """Options every subcommand takes (after the subcommand name, where users type them)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    common.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memagent", description="Read long documents with a fixed-size memory.")
    sub = parser.add_subparsers(dest="command", required=True)
    common = common_options()
    for module in COMMAND_MODULES:
        module.add_commands(sub, common)
    return parser


def _user_error(exc: BaseException) -> bool:
    """Errors that are the user's to fix (inputs, flags, files, endpoints, models), not bugs."""
    from memagent.engines.base import EndpointError

    return isinstance(exc, (ValueError, OSError, EndpointError, ValidationError))


def one_line(exc: BaseException) -> str:
    """The message of a user error in the words of the command line."""
    if isinstance(exc, ValidationError):
        text = "; ".join(
            (f"{e['loc'][-1]}: " if e["loc"] else "") + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors())
    elif isinstance(exc, FileNotFoundError) and exc.filename and not str(exc).startswith("no such"):
        text = f"no such file or directory: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    # Budgets and options are named by their flags (chunk_tokens -> --chunk-tokens).
    text = re.sub(r"(?<![-\w./])([a-z]+(?:_[a-z]+)+)(?=\W|$)(?!\.py)", _as_flag, text)
    return " ".join(text.split())


_FLAG_WORDS: set[str] = set()


def _as_flag(match: re.Match) -> str:
    word = match.group(1)
    return "--" + word.replace("_", "-") if word in _FLAG_WORDS else word


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _FLAG_WORDS.update(a.dest for a in _all_actions(parser) if a.option_strings and "_" in a.dest)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_ray(args.verbose)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)  # a scheduler's stop acts like Ctrl-C
    try:
        # Only a command that may start Ray has its stderr filtered: the others keep the terminal.
        quiet = getattr(args, "starts_ray", False) and not args.verbose
        with known_lines_dropped() if quiet else contextlib.nullcontext():
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"\ninterrupted: memagent {args.command} stopped. Run the same command again to resume "
              "(finished rows and checkpoints are kept).", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place user errors become messages
        if args.debug or not _user_error(exc):
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _all_actions(parser: argparse.ArgumentParser):
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)


if __name__ == "__main__":
    sys.exit(main())
