"""`met top`: the live dashboard attached to a running server, local or remote."""

from __future__ import annotations

import argparse

from met.commands.common import CliError, SubParsers, add_command


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = add_command(subparsers, common, "top", "watch a running met server live")
    parser.add_argument(
        "url", nargs="?", default="http://127.0.0.1:8000", help="server URL (default %(default)s)"
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from met.tui import run_dashboard
    from met.tui.client import ServerUnreachableError, probe

    url = args.url if "://" in args.url else f"http://{args.url}"
    try:
        probe(url)
    except ServerUnreachableError as exc:
        raise CliError(str(exc)) from exc
    run_dashboard(url, server=None)
    return 0
