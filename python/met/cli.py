"""The `met` command line: one argparse tree, one module per subcommand, failures as one line."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from met import __version__
from met.commands import COMMANDS
from met.commands.common import CliError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="met",
        description="met: an LLM inference server with a C++ scheduler core.",
    )
    parser.add_argument("--version", action="version", version=f"met {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks instead of one-line errors"
    )
    # Subparsers share --debug, but SUPPRESS keeps their default from overwriting
    # a `met --debug run` given before the subcommand.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(subparsers, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # A pass-through subcommand (serve) hands its arguments, in order, to its own parser.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    try:
        return int(args.func(args) or EXIT_OK)
    except KeyboardInterrupt:
        print("met: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CliError as exc:
        return _fail(str(exc), args.debug)
    except Exception as exc:  # the contract is one line, not a traceback
        return _fail(f"{type(exc).__name__}: {exc}", args.debug)


def _fail(message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    print(f"met: error: {message}", file=sys.stderr)
    return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
