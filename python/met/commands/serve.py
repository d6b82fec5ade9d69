"""`met serve`: the OpenAI-compatible server, with the live dashboard when run in a terminal."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from met.commands.common import CliError, SubParsers, add_command, interactive_terminal


def register(subparsers: SubParsers, common: argparse.ArgumentParser) -> None:
    # The server owns its flags; parsing them only when serving keeps `met --help` light.
    parser = add_command(
        subparsers,
        common,
        "serve",
        "serve a model over an OpenAI-compatible HTTP API",
        passthrough=True,
    )
    parser.set_defaults(func=_run)


def serve_parser() -> argparse.ArgumentParser:
    from met.server.settings import add_serve_arguments

    parser = argparse.ArgumentParser(
        prog="met serve",
        description="Serve a model over an OpenAI-compatible HTTP API.",
        epilog="In a terminal the live dashboard opens; --no-tui, MET_NO_TUI=1 or a "
        "non-terminal stdout give plain log lines. Every flag also reads MET_<NAME>.",
    )
    add_serve_arguments(parser)
    return parser


def _run(args: argparse.Namespace) -> int:
    from met.server.settings import SettingsError, resolve_settings

    argv = list(args.extra)
    try:
        settings = resolve_settings(serve_parser().parse_args(argv), os.environ)
    except SettingsError as exc:
        raise CliError(str(exc)) from exc
    from met.parallel.launch import launched_rank

    launched = launched_rank()
    worker = launched is not None and launched[0] > 0  # a torchrun rank with nothing to show
    if settings.no_tui or worker or not interactive_terminal():
        from met.server.main import serve_main

        return serve_main(argv, tui=False)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return _serve_with_dashboard(argv, f"http://{host}:{settings.port}", settings.shutdown_grace)


def _serve_with_dashboard(argv: list[str], url: str, grace: float) -> int:
    from met.tui import run_dashboard
    from met.tui.server_process import ServerProcess

    server = ServerProcess(argv)
    try:
        run_dashboard(url, server=server)
    finally:
        if server.returncode() is None:
            print(f"met: stopping the server (draining, up to {grace:.0f} s)...", file=sys.stderr)
        code = server.stop(grace=grace + 5.0)
    if code not in (0, -signal.SIGTERM):
        for line in server.tail():
            print(line, file=sys.stderr)
        server.cleanup()
        raise CliError(f"the server exited with status {code}")
    server.cleanup()
    return 0
