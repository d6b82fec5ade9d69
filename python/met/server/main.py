"""`met serve` / `python -m met.serve`: settings, logging, the engine, uvicorn."""

from __future__ import annotations

import asyncio
import logging
import sys

import uvicorn

from met.parallel.launch import launched_rank
from met.server.app import create_app
from met.server.lifecycle import Lifecycle, QuietSignalServer
from met.server.settings import ServerSettings, SettingsError, load_settings
from met.server.state import ServerState
from met.server.tracking import RecentLogs

_LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
_CONNECTION_GRACE_S = 3  # uvicorn's wait for open connections once the engine has drained


def serve_main(argv: list[str], tui: bool = False) -> int:
    """Run the server until drained after SIGTERM/SIGINT; the exit status.

    `tui` is the caller's choice of a dashboard; the dashboard attaches over /status, so the
    server itself always writes plain log lines.
    """
    del tui
    try:
        settings = load_settings(argv)
    except SettingsError as e:
        print(f"met serve: {e}", file=sys.stderr)
        return 2
    launched = launched_rank()
    if launched is not None:
        return _serve_rank(settings, *launched)
    return _serve_here(settings)


def _serve_rank(settings: ServerSettings, rank: int, world: int) -> int:
    """Under torchrun: rank 0 serves HTTP, every other rank runs the tensor-parallel worker."""
    if settings.engine.tensor_parallel_size != world:
        print(
            f"met serve: launched as rank {rank} of WORLD_SIZE={world}, but "
            f"--tensor-parallel-size is {settings.engine.tensor_parallel_size}; pass "
            f"--tensor-parallel-size {world} on every rank",
            file=sys.stderr,
        )
        return 2
    if rank == 0:
        return _serve_here(settings)
    _configure_logging(settings.log_level)
    from met.parallel.worker import run_worker

    return run_worker(rank, world)


def _serve_here(settings: ServerSettings) -> int:
    logs = _configure_logging(settings.log_level)
    try:
        return asyncio.run(_serve(settings, logs))
    except SystemExit as e:  # uvicorn exits this way when it cannot bind
        return e.code if isinstance(e.code, int) else 1


def _configure_logging(level: str) -> RecentLogs:
    formatter = logging.Formatter(_LOG_FORMAT)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(formatter)
    recent = RecentLogs()
    recent.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [console, recent]
    root.setLevel(level.upper())
    return recent


async def _serve(settings: ServerSettings, logs: RecentLogs) -> int:
    try:
        state = ServerState(None, settings, logs)
    except (ValueError, FileNotFoundError) as e:  # two models of one name, no such folder
        print(f"met serve: {e}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        create_app(state.engine, settings, state),
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=_CONNECTION_GRACE_S,
    )
    server = QuietSignalServer(config)
    lifecycle = Lifecycle(state, server)
    lifecycle.start()
    await server.serve()
    logging.getLogger("met.server").info("stopped")
    return lifecycle.exit_code
